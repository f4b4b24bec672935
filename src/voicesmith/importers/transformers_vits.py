"""A transformers `VitsModel` folder (the MMS-TTS layout): config.json, model.safetensors (or
pytorch_model.bin), and the VitsTokenizer's vocab.json + tokenizer_config.json. Read without
transformers itself: the weights are plain tensors, and the settings plain JSON.

Weights: transformers renamed the original VITS modules (attention q/k/v/out as Linear layers,
where VITS has 1x1 convolutions: unsqueezed here; the duration flows renumbered without their Flip
layers: flow k is VITS's 2k - 1; the prior flows likewise: flow i is VITS's 2i). Its published
checkpoints hold no discriminator, which starts fresh.

Text: the tokenizer's character vocabulary becomes a voicesmith character table that reproduces
its ids: blank id 0 between and around the symbols with no beginning or end id (`^`/`$` map to no
id), lower-casing (upper-case letters are aliases of the lower-case ids) and dropping characters the
vocabulary lacks. Tokenizers that romanise (uroman) or phonemize first are refused with the reason.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from pathlib import Path
from typing import Any, Mapping

import torch

from voicesmith.errors import UserInputError
from voicesmith.importers.mapping import rename
from voicesmith.importers.voice_run import VoiceSource
from voicesmith.text.symbols import BOS, EOS, PAD, SymbolTable

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Settings voicesmith's VITS fixes; a voice with other values cannot be rebuilt exactly.
FIXED = {"window_size": 4, "wavenet_dilation_rate": 1, "duration_predictor_kernel_size": 3,
         "duration_predictor_flow_bins": 10, "duration_predictor_tail_bound": 5.0, "duration_predictor_num_flows": 4,
         "depth_separable_num_layers": 3, "depth_separable_channels": 2, "hidden_act": "relu", "use_bias": True}


def _prior_flow(match: re.Match) -> str:
    """Prior coupling layer i is VITS's flows.2i (a Flip layer follows each)."""
    return f"{match[1]}{2 * int(match[2])}."


def _duration_flow(match: re.Match) -> str:
    """Duration flow 0 (the affine one) keeps its index; spline flow k is VITS's 2k - 1 (Flips between)."""
    index = int(match[2])
    return f"{match[1]}{index if index == 0 else 2 * index - 1}."


RULES = [
    (r"^text_encoder\.embed_tokens\.", "enc_p.emb."),
    (r"^text_encoder\.project\.", "enc_p.proj."),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.attention\.(q|k|v)_proj\.", r"enc_p.encoder.attn_layers.\1.conv_\2."),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.attention\.out_proj\.", r"enc_p.encoder.attn_layers.\1.conv_o."),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.attention\.", r"enc_p.encoder.attn_layers.\1."),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.layer_norm\.", r"enc_p.encoder.norm_layers_1.\1."),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.final_layer_norm\.", r"enc_p.encoder.norm_layers_2.\1."),
    (r"^text_encoder\.encoder\.layers\.(\d+)\.feed_forward\.", r"enc_p.encoder.ffn_layers.\1."),
    (r"^(flow\.flows\.)(\d+)\.", _prior_flow),
    (r"^(flow\.flows\.\d+\.|posterior_encoder\.)conv_pre\.", r"\1pre."),
    (r"^(flow\.flows\.\d+\.)conv_post\.", r"\1post."),
    (r"^(flow\.flows\.\d+\.|posterior_encoder\.)wavenet\.", r"\1enc."),
    (r"^posterior_encoder\.conv_proj\.", "posterior_encoder.proj."),
    (r"^posterior_encoder\.", "enc_q."),
    (r"^decoder\.upsampler\.", "dec.ups."),
    (r"^decoder\.", "dec."),
    (r"^embed_speaker\.", "emb_g."),
    (r"^duration_predictor\.", "dp."),
    (r"^(dp\.(?:post_)?flows\.)(\d+)\.", _duration_flow),
    (r"^(dp\.(?:post_)?flows\.0\.)translate$", r"\1m"),
    (r"^(dp\.(?:post_)?flows\.0\.)log_scale$", r"\1logs"),
    (r"^dp\.(post_)?conv_pre\.", r"dp.\1pre."),
    (r"^dp\.(post_)?conv_proj\.", r"dp.\1proj."),
    (r"^dp\.(post_)?conv_dds\.", r"dp.\1convs."),
    (r"^(dp\.(?:post_)?flows\.\d+\.)conv_pre\.", r"\1pre."),
    (r"^(dp\.(?:post_)?flows\.\d+\.)conv_proj\.", r"\1proj."),
    (r"^(dp\.(?:post_)?flows\.\d+\.)conv_dds\.", r"\1convs."),
    (r"\.convs_dilated\.", ".convs_sep."),
    (r"\.convs_pointwise\.", ".convs_1x1."),
    (r"(norms_[12]\.\d+|norm_[12]|norm_layers_[12]\.\d+)\.weight$", r"\1.gamma"),
    (r"(norms_[12]\.\d+|norm_[12]|norm_layers_[12]\.\d+)\.bias$", r"\1.beta"),
]
LINEAR_AS_CONV = r"^enc_p\.encoder\.attn_layers\.\d+\.conv_[qkvo]\.weight$"


def read_transformers_vits(folder: Path) -> VoiceSource:
    folder = Path(folder)
    settings = _read_json(folder / "config.json")
    if settings.get("model_type") != "vits":
        raise UserInputError(f"{folder / 'config.json'}: model_type is {settings.get('model_type')!r}, not 'vits'; "
                             f"import-voice reads transformers VitsModel folders (e.g. an MMS-TTS voice).")
    _check_fixed(settings, folder)
    symbols, text_notes = tokenizer_symbols(folder)
    tensors = rename(_read_weights(folder), RULES)
    for name in [name for name in tensors if re.match(LINEAR_AS_CONV, name)]:
        tensors[name] = tensors[name].unsqueeze(-1)  # Linear [out, in] -> 1x1 Conv1d [out, in, 1]
    n_speakers = int(settings.get("num_speakers", 1))
    fresh = {"discriminator.": "transformers' VITS checkpoints carry no discriminator; it starts fresh"}
    return VoiceSource(kind="transformers VitsModel", path=folder, tensors=tensors, preset="high",
                       sections=_sections(settings, tensors, folder), symbols=symbols, n_speakers=n_speakers,
                       speakers={f"speaker_{i}": i for i in range(n_speakers)} if n_speakers > 1 else {},
                       fresh=fresh, notes=text_notes)


def tokenizer_symbols(folder: Path) -> tuple[SymbolTable, list[str]]:
    """The voicesmith character table that gives the VitsTokenizer's ids, and what it could not carry over."""
    vocab = _read_json(folder / "vocab.json")
    options = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    _check_tokenizer(vocab, options, folder)
    blank = next((token for token, index in vocab.items() if index == 0), None)
    table = {token: [int(index)] for token, index in vocab.items() if token not in (PAD, BOS, EOS)}
    table.update({PAD: [0], BOS: [], EOS: []})
    notes = [f"Text: {len(vocab)} characters, blank id 0 ({blank!r}) between and around them, no begin/end id."]
    if options.get("normalize", True):
        for token, ids in list(table.items()):
            upper = token.upper()
            if len(upper) == 1 and upper not in table:
                table[upper] = ids  # the tokenizer lower-cases: an upper-case letter reads as its lower case
    else:
        notes.append("The tokenizer has normalize: false (no lower-casing; unknown characters become its unk id); "
                     "voicesmith reads the characters as they are and drops unknown ones.")
    unreachable = [token for token in vocab if token in (BOS, EOS) or (token == PAD and vocab[token] != 0)]
    if unreachable:
        notes.append(f"The vocabulary's {unreachable} are voicesmith's control symbols: text can no longer give them.")
    return SymbolTable(table, kind="characters"), notes


def _check_tokenizer(vocab: Mapping[str, int], options: Mapping[str, Any], folder: Path) -> None:
    """Refuse, with the reason, a tokenizer whose ids voicesmith's character mode cannot reproduce."""
    for option, why in (("is_uroman", "romanises its text with uroman first"),
                        ("phonemize", "phonemizes its text with the phonemizer package first")):
        if options.get(option, option == "phonemize"):
            raise UserInputError(f"{folder}: the tokenizer {why} ({option}: true in tokenizer_config.json), which "
                                 f"voicesmith cannot reproduce offline, so the voice would be fed other ids than it "
                                 f"was trained on. Only voices that read plain characters can be imported.")
    if not options.get("add_blank", True):
        raise UserInputError(f"{folder}: the tokenizer has add_blank: false; voicesmith always puts a blank between "
                             f"symbols, so this voice cannot be fed its own ids.")
    bad = [token for token in vocab if len(token) != 1 or unicodedata.normalize("NFD", token) != token]
    if bad:
        raise UserInputError(f"{folder / 'vocab.json'}: tokens {bad[:8]} are not single characters that stay as they "
                             f"are under NFD; voicesmith's character mode reads decomposed single code points, so it "
                             f"could not produce their ids.")


def _sections(settings: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], folder: Path) -> dict:
    hop = math.prod(settings["upsample_rates"])
    n_fft = (int(settings["spectrogram_bins"]) - 1) * 2
    stochastic = bool(settings.get("use_stochastic_duration_prediction", True))
    dp_input = tensors.get("dp.pre.weight" if stochastic else "dp.conv_1.weight")
    if dp_input is None:
        raise UserInputError(f"{folder}: the weights lack the duration predictor; the folder is incomplete.")
    model = dict(hidden_channels=settings["hidden_size"], inter_channels=settings["flow_size"],
                 encoder_ffn_channels=settings["ffn_dim"], encoder_kernel_size=settings.get("ffn_kernel_size", 3),
                 encoder_heads=settings["num_attention_heads"], encoder_layers=settings["num_hidden_layers"],
                 posterior_layers=settings["posterior_encoder_num_wavenet_layers"],
                 posterior_kernel_size=settings["wavenet_kernel_size"], flow_layers=settings["prior_encoder_num_flows"],
                 flow_wavenet_layers=settings["prior_encoder_num_wavenet_layers"],
                 flow_kernel_size=settings["wavenet_kernel_size"], stochastic_duration=stochastic,
                 duration_predictor_channels=int(dp_input.shape[0]), resblock="1",
                 resblock_kernel_sizes=settings["resblock_kernel_sizes"],
                 resblock_dilation_sizes=settings["resblock_dilation_sizes"],
                 upsample_rates=settings["upsample_rates"], upsample_kernel_sizes=settings["upsample_kernel_sizes"],
                 upsample_initial_channel=settings["upsample_initial_channel"])
    if int(settings.get("num_speakers", 1)) > 1:
        model["speaker_embedding_dim"] = settings["speaker_embedding_size"]
    speaking_rate = float(settings.get("speaking_rate", 1.0))
    return {"model": model,
            "audio": dict(sample_rate=settings["sampling_rate"], n_fft=n_fft, win_length=n_fft, hop_length=hop),
            "text": dict(language=str(_tokenizer_language(folder)), phonemizer="characters", normalize=False),
            "inference": dict(noise_scale=float(settings.get("noise_scale", 0.667)),
                              noise_w=float(settings.get("noise_scale_duration", 0.8)),
                              length_scale=1.0 / speaking_rate)}


def _check_fixed(settings: Mapping[str, Any], folder: Path) -> None:
    differ = [f"{key} = {settings[key]!r} (voicesmith: {value!r})" for key, value in FIXED.items()
              if key in settings and settings[key] != value]
    if differ:
        raise UserInputError(f"{folder / 'config.json'}: this voice's architecture differs from the VITS voicesmith "
                             f"trains: {'; '.join(differ)}. It cannot be rebuilt exactly, so it is not imported.")


def _tokenizer_language(folder: Path) -> str:
    path = folder / "tokenizer_config.json"
    return (_read_json(path).get("language") if path.is_file() else None) or "und"


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # safetensors and torch raise several types for a damaged or unsafe file
            raise UserInputError(f"{path} cannot be read safely ({type(exc).__name__}: {str(exc)[:200]}). "
                                 f"Use the weights that came with the voice.") from None
    raise UserInputError(f"{folder} has no weights: expected {' or '.join(WEIGHT_FILES)} beside config.json.")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserInputError(f"{path} is missing; a transformers VitsModel folder needs config.json, the weights, "
                             f"vocab.json and tokenizer_config.json.") from None
    except (OSError, ValueError) as exc:
        raise UserInputError(f"{path} is not readable JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path} holds a JSON {type(data).__name__}, not an object.")
    return data
