import pytest
import torch
import torch.nn.functional as F

from pbr.data.augment import MEAN_STD, Augment, crop_flip, normalize, random_crop_flip, sample_crop_flip_params


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(b: int, side: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (b, 3, side, side), dtype=torch.uint8, generator=_gen(seed))


def _reference(x: torch.Tensor, dy, dx, flip, padding: int) -> torch.Tensor:
    h, w = x.shape[-2:]
    out = []
    for i in range(x.shape[0]):
        img = F.pad(x[i], (padding, padding, padding, padding))[:, int(dy[i]) : int(dy[i]) + h, int(dx[i]) : int(dx[i]) + w]
        out.append(img.flip(-1) if bool(flip[i]) else img)
    return torch.stack(out)


@pytest.mark.parametrize("side", [32, 64])
def test_crop_flip_matches_per_image_reference(side):
    p = 4
    # every offset pair at the extremes and the middle, with and without flip
    grid = [(a, b, f) for a in (0, 4, 8) for b in (0, 3, 8) for f in (False, True)]
    dy = torch.tensor([g[0] for g in grid])
    dx = torch.tensor([g[1] for g in grid])
    flip = torch.tensor([g[2] for g in grid])
    x = _images(len(grid), side)
    out = crop_flip(x, dy, dx, flip, padding=p)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, _reference(x, dy, dx, flip, p))


@pytest.mark.parametrize("side", [32, 64])
def test_random_crop_flip_uses_the_drawn_parameters(side):
    x = _images(16, side, seed=1)
    out = random_crop_flip(x, padding=4, generator=_gen(5))
    dy, dx, flip = sample_crop_flip_params(16, 4, _gen(5), "cpu")
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, _reference(x, dy, dx, flip, 4))


def test_offsets_cover_range_and_flip_rate():
    dy, dx, flip = sample_crop_flip_params(20000, 4, _gen(2), "cpu")
    assert set(dy.tolist()) == set(range(9)) and set(dx.tolist()) == set(range(9))
    counts = torch.bincount(dy, minlength=9).float() / 20000
    assert (counts - 1 / 9).abs().max() < 0.015
    assert abs(flip.float().mean().item() - 0.5) < 0.02


def test_zero_padding_only_flips():
    x = _images(4, 32, seed=3)
    out = crop_flip(x, torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 0, 1]).bool(), padding=0)
    assert torch.equal(out[0], x[0]) and torch.equal(out[1], x[1].flip(-1))


def test_normalize():
    x = torch.tensor([0, 255], dtype=torch.uint8).reshape(1, 1, 1, 2).expand(1, 3, 1, 2).contiguous()
    mean, std = MEAN_STD["cifar10"]
    out = normalize(x, mean, std)
    assert out.dtype == torch.float32
    for c in range(3):
        torch.testing.assert_close(out[0, c, 0], torch.tensor([-mean[c] / std[c], (1 - mean[c]) / std[c]]))
    with pytest.raises(ValueError):
        normalize(x.float(), mean, std)


def test_augment_is_a_padded_crop_and_flip_then_normalized():
    """Each output image is one of the 9 x 9 x 2 padded crops (flipped or not) of its input, scaled
    to [0, 1] and standardised per channel by hand; which one is drawn from the generator."""
    mean, std = MEAN_STD["tinyimagenet"]
    aug = Augment(mean, std, padding=4)
    x = _images(8, 64, seed=4)
    out = aug(x, _gen(9))
    assert out.dtype == torch.float32 and out.shape == x.shape
    m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    drawn = []
    for i in range(8):
        padded = F.pad(x[i].float() / 255, (4, 4, 4, 4))  # zero padding, before standardising
        crops = {(dy, dx, f): ((padded[:, dy:dy + 64, dx:dx + 64].flip(-1) if f else padded[:, dy:dy + 64, dx:dx + 64]) - m) / s
                 for dy in range(9) for dx in range(9) for f in (False, True)}
        hits = [k for k, c in crops.items() if torch.allclose(out[i], c, atol=1e-5)]
        assert len(hits) == 1, (i, hits)
        drawn.append(hits[0])
    assert len(set(drawn)) > 1  # drawn per image, not once per batch
    assert torch.equal(aug(x, _gen(9)), out) and not torch.equal(aug(x, _gen(10)), out)


def test_constants():
    assert MEAN_STD["cifar100"] == ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))
    assert set(MEAN_STD) == {"cifar10", "cifar100", "tinyimagenet"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x = _images(32, 64, seed=6)
    dy, dx, flip = sample_crop_flip_params(32, 4, torch.Generator(device="cuda").manual_seed(0), "cuda")
    out = crop_flip(x.cuda(), dy, dx, flip, 4)
    assert torch.equal(out.cpu(), crop_flip(x, dy.cpu(), dx.cpu(), flip.cpu(), 4))
    aug = Augment(*MEAN_STD["cifar10"])
    y = aug(x.cuda(), torch.Generator(device="cuda").manual_seed(1))
    assert y.device.type == "cuda" and y.dtype == torch.float32
    with pytest.raises(ValueError):
        random_crop_flip(x.cuda(), 4, _gen())
