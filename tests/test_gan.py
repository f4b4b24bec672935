"""The shared GAN parts: HiFi-GAN generator, discriminators and LSGAN losses."""

import pytest
import torch
from torch.nn.utils import parametrize

from voicesmith.models.gan import (
    CombinedDiscriminator,
    HifiGanGenerator,
    MultiPeriodDiscriminator,
    MultiResolutionDiscriminator,
    discriminator_loss,
    feature_matching_loss,
    generator_adversarial_loss,
    split_real_fake,
)

SMALL = {
    "1": dict(resblock="1", resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
              upsample_rates=(8, 4), upsample_initial_channel=32, upsample_kernel_sizes=(16, 8)),
    "2": dict(resblock="2", resblock_kernel_sizes=(3, 5, 7), resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)),
              upsample_rates=(4, 4, 2), upsample_initial_channel=32, upsample_kernel_sizes=(8, 8, 4)),
}


@pytest.mark.parametrize("kind", ["1", "2"])
def test_generator_maps_frames_to_hop_samples(kind):
    torch.manual_seed(0)
    generator = HifiGanGenerator(10, **SMALL[kind], gin_channels=4)
    assert generator.hop_length == 32
    audio = generator(torch.randn(2, 10, 13), torch.randn(2, 4, 1))
    assert audio.shape == (2, 1, 13 * 32)
    assert audio.abs().max() <= 1.0


def test_generator_names_match_vits():
    names = set(HifiGanGenerator(10, **SMALL["1"], gin_channels=4).state_dict())
    for name in ("conv_pre.weight", "ups.0.parametrizations.weight.original0",
                 "ups.1.parametrizations.weight.original1", "resblocks.3.convs1.2.parametrizations.weight.original1",
                 "resblocks.0.convs2.0.bias", "conv_post.weight", "cond.weight"):
        assert name in names
    assert "conv_post.bias" not in names
    assert not any(name.startswith("cond") for name in HifiGanGenerator(10, **SMALL["2"]).state_dict())


@pytest.mark.parametrize("kind", ["1", "2"])
def test_remove_weight_norm_keeps_the_output(kind):
    torch.manual_seed(0)
    generator = HifiGanGenerator(10, **SMALL[kind]).eval()
    frames = torch.randn(1, 10, 9)
    with torch.no_grad():
        before = generator(frames)
        generator.remove_weight_norm()
        after = generator(frames)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    assert not any(parametrize.is_parametrized(module) for module in generator.modules())
    assert not any("parametrizations" in name for name in generator.state_dict())


def test_generator_exports_to_onnx_after_remove_weight_norm(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    generator = HifiGanGenerator(10, **SMALL["2"]).eval()
    generator.remove_weight_norm()
    path = tmp_path / "generator.onnx"
    torch.onnx.export(generator, (torch.randn(1, 10, 5),), str(path), input_names=["frames"],
                      output_names=["audio"], dynamic_axes={"frames": {0: "batch", 2: "time"}}, dynamo=False)
    longer = torch.randn(2, 10, 11)  # another batch size and length than the traced ones
    (audio,) = onnxruntime.InferenceSession(str(path)).run(None, {"frames": longer.numpy()})
    torch.testing.assert_close(torch.from_numpy(audio), generator(longer).detach(), atol=1e-5, rtol=0)


def test_resblock_mask_zeroes_padding():
    generator = HifiGanGenerator(10, **SMALL["1"])
    block = generator.resblocks[0]
    mask = torch.ones(1, 1, 20)
    mask[..., 15:] = 0
    out = block(torch.randn(1, 16, 20), mask)
    assert out[..., 15:].abs().max() == 0


def test_multi_period_discriminator_size_and_outputs():
    discriminator = MultiPeriodDiscriminator()
    assert sum(p.numel() for p in discriminator.parameters()) == 46_747_132
    assert type(discriminator.discriminators[0]).__name__ == "DiscriminatorS"
    assert [d.period for d in discriminator.discriminators[1:]] == [2, 3, 5, 7, 11]
    scores, features = discriminator(torch.randn(2, 1, 2000))  # 2000 is not a multiple of 3, 7, 11
    assert len(scores) == len(features) == 6
    assert all(score.shape[0] == 2 for score in scores)
    assert [len(maps) for maps in features] == [7, 6, 6, 6, 6, 6]


def test_combined_discriminator_concatenates():
    combined = CombinedDiscriminator(MultiPeriodDiscriminator(periods=(2,)),
                                     MultiResolutionDiscriminator(resolutions=((256, 64, 256),)))
    scores, features = combined(torch.randn(3, 1, 1024))
    assert len(scores) == len(features) == 3
    assert features[2][0].shape[:2] == (3, 32)


def test_losses_zero_at_their_optimum():
    ones, zeros = [torch.ones(2, 5), torch.ones(2, 3)], [torch.zeros(2, 5), torch.zeros(2, 3)]
    assert discriminator_loss(ones, zeros).item() == 0
    assert discriminator_loss(zeros, ones).item() == pytest.approx(4.0)
    assert generator_adversarial_loss(ones).item() == 0
    assert generator_adversarial_loss(zeros).item() == pytest.approx(2.0)


def test_feature_matching_zero_only_for_equal_features():
    features = [[torch.randn(2, 4, 6), torch.randn(2, 1, 6)], [torch.randn(2, 3)]]
    assert feature_matching_loss(features, features).item() == 0
    shifted = [[f + 0.5 for f in maps] for maps in features]
    assert feature_matching_loss(features, shifted).item() == pytest.approx(2 * 3 * 0.5)


def test_feature_matching_gradient_reaches_only_the_fake_branch():
    real = torch.randn(2, 1, 1024, requires_grad=True)
    fake = torch.randn(2, 1, 1024, requires_grad=True)
    discriminator = MultiPeriodDiscriminator(periods=(2, 3))
    _, features = discriminator(torch.cat([real, fake]))
    real_features, fake_features = split_real_fake(features, n_real=2)
    feature_matching_loss(real_features, fake_features).backward()
    assert real.grad is None or real.grad.abs().max() == 0
    assert fake.grad.abs().max() > 0


def test_split_real_fake_keeps_nesting():
    scores = [torch.arange(6).view(6, 1), torch.arange(12).view(6, 2)]
    real, fake = split_real_fake(scores, 4)
    assert [s.shape[0] for s in real] == [4, 4] and [s.shape[0] for s in fake] == [2, 2]


def test_losses_run_in_fp32_under_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = discriminator_loss([torch.ones(2, 3, dtype=torch.bfloat16)], [torch.full((2, 3), 0.1).bfloat16()])
    assert loss.dtype == torch.float32


def test_channel_divisor_narrows_the_discriminator_keeping_its_outputs():
    full, narrow = MultiPeriodDiscriminator((2, 3)), MultiPeriodDiscriminator((2, 3), channel_divisor=4)
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in full.parameters()) / 10
    audio = torch.randn(2, 1, 4096)
    (full_scores, full_features), (scores, features) = full(audio), narrow(audio)
    assert [s.shape for s in scores] == [s.shape for s in full_scores]
    assert [len(maps) for maps in features] == [len(maps) for maps in full_features]
