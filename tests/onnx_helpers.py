"""Small graphs with Piper's interface, for voices whose audio must reveal what the graph was fed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_probe_voice(folder: Path, config: dict, symbol_values: np.ndarray,
                      speaker_values: np.ndarray | None = None) -> Path:
    """NAME.onnx + NAME.onnx.json whose audio [1, 1, phonemes] is symbol_values[id] (+ speaker_values[sid]).

    A real graph run by onnxruntime with Piper's inputs (input, input_lengths, scales, and sid when
    `speaker_values` is given): what comes out says which ids and speaker went in.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    tables = [numpy_helper.from_array(symbol_values.reshape(-1, 1).astype(np.float32), "symbol_table")]
    inputs = [helper.make_tensor_value_info("input", TensorProto.INT64, ["batch", "phonemes"]),
              helper.make_tensor_value_info("input_lengths", TensorProto.INT64, ["batch"]),
              helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3])]
    nodes = [helper.make_node("Gather", ["symbol_table", "input"], ["embedded"]),  # [b, p, 1]
             helper.make_node("Transpose", ["embedded"], ["per_symbol"], perm=[0, 2, 1])]  # [b, 1, p]
    audio = "per_symbol"
    if speaker_values is not None:
        tables.append(numpy_helper.from_array(speaker_values.reshape(-1, 1).astype(np.float32), "speaker_table"))
        inputs.append(helper.make_tensor_value_info("sid", TensorProto.INT64, ["batch"]))
        tables.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis"))
        nodes += [helper.make_node("Gather", ["speaker_table", "sid"], ["speaker"]),  # [b, 1]
                  helper.make_node("Unsqueeze", ["speaker", "last_axis"], ["speaker_b11"]),  # [b, 1, 1]
                  helper.make_node("Add", ["per_symbol", "speaker_b11"], ["with_speaker"])]
        audio = "with_speaker"
    nodes.append(helper.make_node("Identity", [audio], ["output"]))
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1, "time"])
    graph = helper.make_graph(nodes, "probe_voice", inputs, [output], initializer=tables)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    onnx.checker.check_model(model)
    path = Path(folder) / "probe.onnx"
    onnx.save(model, str(path))
    Path(f"{path}.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return path
