"""DomainBed's training augmentation, drawn per image, applied to a whole batch on its device.

DomainBed trains every image-folder dataset with::

    RandomResizedCrop(224, scale=(0.7, 1.0)), RandomHorizontalFlip(),
    ColorJitter(0.3, 0.3, 0.3, 0.3), RandomGrayscale(p=0.1), ToTensor(), Normalize(ImageNet)

:class:`DomainBedAugment` is that transform with torchvision's parameter distributions and
colour kernels, on a float batch in [0, 1] (before normalisation), with every random draw
taken from the caller's ``torch.Generator`` (the client's seeded data-order generator), so a
seed gives the same batches on either backend and any number of actors.

Why not ``torchvision.transforms.v2`` on the batch: a v2 transform draws *one* set of
parameters per call, so a batch would share one crop, one flip and one jitter, where DomainBed
draws them per image; calling it once per image costs B times the kernel launches, and v2 draws
from torch's global RNG, not a generator. So the per-image parameters are drawn here (the same
distributions as ``RandomResizedCrop.get_params`` and ``ColorJitter.get_params``) and applied
batched: the crop and flip as one affine ``grid_sample`` (bilinear), brightness / contrast /
saturation as torchvision's blends with a per-image factor, hue through torchvision's RGB↔HSV
formulas, each image's four jitter operations in its own random order.

Departure (also in ``docs/methods-protocol.md`` §5.8): the crop is taken from the cached image (already
resized to ``S × S``), not from the original file. The crop's resize is bilinear without
antialiasing, as ``F.resized_crop(..., antialias=False)`` on a tensor (equal to it within float
rounding); PIL, which DomainBed uses, antialiases when it shrinks, which a crop of at least 70 %
of the area resized back to the full side never does by much.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from fedtune.config import AUGMENTS
_GREY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` -> ``[B, 1, H, W]`` luma with torchvision's weights."""
    r, g, b = x.unbind(dim=-3)
    return (_GREY[0] * r + _GREY[1] * g + _GREY[2] * b).unsqueeze(-3)


def _per_image(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * _per_image(factor)).clamp_(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    f = _per_image(factor)
    mean = grayscale(x).mean(dim=(-3, -2, -1), keepdim=True)
    return (f * x + (1.0 - f) * mean).clamp_(0.0, 1.0)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    f = _per_image(factor)
    return (f * x + (1.0 - f) * grayscale(x)).clamp_(0.0, 1.0)


def adjust_hue(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_hue`` (RGB -> HSV, ``h += factor`` mod 1, HSV -> RGB) with a
    per-image ``factor`` in [-0.5, 0.5]. A hue shift keeps each pixel's value ``v = max`` and
    saturation, so only the hue is computed (torchvision's case split on which channel is the
    maximum) and the shifted colour is rebuilt with the closed form
    ``c_n = v − v·s·clamp(min(k, 4 − k), 0, 1)``, ``k = (n + 6h) mod 6``, ``n = 5, 3, 1`` for R, G,
    B: equal to torchvision's lookup-table conversion up to float rounding, in far fewer passes."""
    r, g, b = x.unbind(dim=-3)
    maxc = torch.maximum(torch.maximum(r, g), b)
    crange = maxc - torch.minimum(torch.minimum(r, g), b)
    # 6h before the shift, in [-1, 5): torchvision's three cases by which channel is the maximum
    num = torch.where(maxc == r, g - b, torch.where(maxc == g, (b - r).add_(crange, alpha=2.0),
                                                    (r - g).add_(crange, alpha=4.0)))
    h6 = num.div_(torch.where(crange > 0, crange, 1.0))  # grey pixels (crange 0): hue 0
    h6 = h6.add_(6.0 * factor.view(-1, 1, 1)).remainder_(6.0)
    n = torch.tensor([5.0, 3.0, 1.0], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    k = (h6.unsqueeze(-3) + n).remainder_(6.0)
    return maxc.unsqueeze(-3) - crange.unsqueeze(-3) * torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)


_JITTER = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


class DomainBedAugment:
    """DomainBed's training transform on ``[B, 3, H, W]`` float batches in [0, 1]; output
    ``[B, 3, size, size]`` (``size`` defaults to the input's side). See the module docstring.

    >>> aug = DomainBedAugment()
    >>> x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    >>> y1 = aug(x, torch.Generator().manual_seed(1)); y2 = aug(x, torch.Generator().manual_seed(1))
    >>> y1.shape, bool(torch.equal(y1, y2)), bool(y1.min() >= 0 and y1.max() <= 1)
    (torch.Size([4, 3, 16, 16]), True, True)
    """

    def __init__(self, size: int | None = None, scale: tuple[float, float] = (0.7, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_p: float = 0.5, jitter: float = 0.3,
                 grey_p: float = 0.1):
        self.size, self.scale, self.ratio = size, scale, ratio
        self.flip_p, self.jitter, self.grey_p = flip_p, jitter, grey_p

    def crop_boxes(self, n: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
        """``[n, 4]`` float64 (top, left, h, w): ``RandomResizedCrop.get_params`` per image (ten
        tries of area and log-ratio, the first that fits; else the central crop)."""
        area = height * width
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        u = torch.rand(n, 10, 4, generator=generator, dtype=torch.float64)
        target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[..., 0])
        aspect = torch.exp(lo + (hi - lo) * u[..., 1])
        w = torch.round(torch.sqrt(target * aspect))
        h = torch.round(torch.sqrt(target / aspect))
        ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = torch.argmax(ok.to(torch.int8), dim=1)
        rows = torch.arange(n)
        w, h, any_ok = w[rows, first], h[rows, first], ok.any(dim=1)
        top = torch.floor(u[rows, first, 2] * (height - h + 1))
        left = torch.floor(u[rows, first, 3] * (width - w + 1))
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            fw, fh = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            fw, fh = round(height * self.ratio[1]), height
        else:
            fw, fh = width, height
        fallback = torch.tensor([(height - fh) // 2, (width - fw) // 2, fh, fw], dtype=torch.float64)
        boxes = torch.stack([top, left, h, w], dim=1)
        return torch.where(any_ok.unsqueeze(1), boxes, fallback)

    def params(self, n: int, height: int, width: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Every image's draws, on the CPU: crop box, flip, jitter factors and order, grayscale."""
        boxes = self.crop_boxes(n, height, width, generator)
        u = torch.rand(n, 6, generator=generator, dtype=torch.float64)
        j = self.jitter
        factors = torch.stack([1 - j + 2 * j * u[:, 0], 1 - j + 2 * j * u[:, 1], 1 - j + 2 * j * u[:, 2],
                               -j + 2 * j * u[:, 3]], dim=1)
        order = torch.argsort(torch.rand(n, 4, generator=generator), dim=1)  # a random permutation per image
        return {"boxes": boxes, "flip": u[:, 4] < self.flip_p, "factors": factors, "order": order,
                "grey": u[:, 5] < self.grey_p}

    def apply(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        n, _, height, width = x.shape
        size = self.size or height
        top, left, h, w = p["boxes"].unbind(1)
        sx = torch.where(p["flip"], -w / width, w / width)
        theta = torch.zeros(n, 2, 3, dtype=torch.float64)
        theta[:, 0, 0] = sx
        theta[:, 0, 2] = (2 * left + w) / width - 1
        theta[:, 1, 1] = h / height
        theta[:, 1, 2] = (2 * top + h) / height - 1
        grid = F.affine_grid(theta.to(device=x.device, dtype=x.dtype), [n, 3, size, size], align_corners=False)
        # Clamp every sample point into its crop box (pixel centres left .. left + w - 1): the crop's
        # edge is replicated, as F.resized_crop's bilinear resize does, instead of reading outside.
        lo = torch.stack([(2 * left + 1) / width - 1, (2 * top + 1) / height - 1], dim=1)
        hi = torch.stack([(2 * (left + w) - 1) / width - 1, (2 * (top + h) - 1) / height - 1], dim=1)
        grid = torch.maximum(torch.minimum(grid, hi.to(grid).view(n, 1, 1, 2)), lo.to(grid).view(n, 1, 1, 2))
        out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        out = out.clamp_(0.0, 1.0)
        factors = p["factors"].to(device=x.device, dtype=x.dtype)
        order = p["order"]
        for slot in range(4):  # each image's k-th jitter operation, grouped by operation
            for op in range(4):
                rows = torch.nonzero(order[:, slot] == op).flatten()
                if len(rows) == 0:
                    continue
                if len(rows) == n:
                    out = _JITTER[op](out, factors[:, op])
                else:
                    idx = rows.to(x.device)
                    out.index_copy_(0, idx, _JITTER[op](out.index_select(0, idx), factors[idx, op]))
        grey = torch.nonzero(p["grey"]).flatten()
        if len(grey):
            idx = grey.to(x.device)
            out.index_copy_(0, idx, grayscale(out.index_select(0, idx)).expand(-1, 3, -1, -1))
        return out

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        with torch.no_grad():
            return self.apply(x, self.params(x.shape[0], x.shape[2], x.shape[3], generator))


def make_augment(name: str, image_size: int | None = None) -> DomainBedAugment | None:
    """The training augmentation ``name`` (``none`` -> None)."""
    if name == "none":
        return None
    if name == "domainbed":
        return DomainBedAugment(image_size)
    raise ValueError(f"augment '{name}' is unknown; allowed: {', '.join(AUGMENTS)}")
