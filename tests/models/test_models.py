"""Models and the flat-weight layout (fedtune/models.py)."""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pytest
import torch

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.layout import FlatLayout
from fedtune.models import build_model, count_parameters, encode
from fedtune.flat_weights import get_flat, set_flat


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return build_model("resnet18", input_shape=(3, 32, 32), num_classes=7)


def _out(model, shape, batch=2):
    model.eval()
    with torch.no_grad():
        return model(torch.randn(batch, *shape)).shape


# ------------------------------------------------------------------------------------ shapes
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 64, 64)])
def test_cnn_output_shape(shape):
    model = build_model("cnn", input_shape=shape, num_classes=10)
    assert _out(model, shape) == (2, 10)
    # the classifier's input is 64 channels x (side/4)^2 pixels
    assert model.classifier[1].in_features == 64 * (shape[1] // 4) ** 2


def test_mlp_output_shape_and_widths():
    model = build_model("mlp", input_shape=(2,), num_classes=3, mlp_hidden=[5, 4])
    assert _out(model, (2,), batch=6) == (6, 3)
    # (2*5+5) + (5*4+4) + (4*3+3)
    assert count_parameters(model) == 15 + 24 + 15
    img = build_model("mlp", input_shape=(1, 4, 4), num_classes=2, mlp_hidden=[3])
    assert _out(img, (1, 4, 4)) == (2, 2)  # flattens images
    assert count_parameters(img) == (16 * 3 + 3) + (3 * 2 + 2)


def test_mlp_without_hidden_layers_is_linear():
    model = build_model("mlp", input_shape=(4,), num_classes=3, mlp_hidden=[])
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 and count_parameters(model) == 4 * 3 + 3
    assert _out(model, (4,)) == (2, 3)


def test_mlp_default_hidden_widths():
    model = build_model("mlp", input_shape=(2,), num_classes=2)
    assert [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)] == [256, 256, 2]


def test_resnet18_output_shape(resnet):
    assert _out(resnet, (3, 32, 32)) == (2, 7)


def test_resnet18_one_channel_input():
    model = build_model("resnet18", input_shape=(1, 28, 28), num_classes=4)
    assert model.conv1.in_channels == 1
    assert _out(model, (1, 28, 28)) == (2, 4)


@pytest.mark.parametrize("name", ["cnn", "resnet18"])
def test_image_models_reject_vector_input(name):
    with pytest.raises(ValueError, match=rf"field 'model': {name} needs image input.*use mlp"):
        build_model(name, input_shape=(2,), num_classes=2)


def test_cnn_rejects_non_square_or_tiny_images():
    with pytest.raises(ValueError, match="square images of side >= 8"):
        build_model("cnn", input_shape=(1, 28, 32), num_classes=2)
    with pytest.raises(ValueError, match="square images of side >= 8"):
        build_model("cnn", input_shape=(1, 4, 4), num_classes=2)


def test_unknown_model():
    with pytest.raises(ValueError, match="'vgg' is unknown; allowed: cnn, mlp or a torchvision classification model"):
        build_model("vgg", input_shape=(2,), num_classes=2)


def test_initialisation_follows_the_global_seed():
    vecs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        m = build_model("mlp", input_shape=(3,), num_classes=2, mlp_hidden=[4])
        vecs.append(get_flat(m, FlatLayout.of(m)))
    assert vecs[0].tobytes() == vecs[1].tobytes()
    assert vecs[0].tobytes() != vecs[2].tobytes()


# ------------------------------------------------------------------------------------ layout
def test_flat_layout_mlp_is_params_only():
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[4])
    layout = FlatLayout.of(model)
    assert layout.num_params == layout.size == 2 * 4 + 4 + 4 * 2 + 2
    assert [s.name for s in layout.slots] == ["1.weight", "1.bias", "3.weight", "3.bias"]
    assert [(n, (sl.start, sl.stop)) for n, sl in layout.param_slices()] == [
        ("1.weight", (0, 8)), ("1.bias", (8, 12)), ("3.weight", (12, 20)), ("3.bias", (20, 22))]


def test_flat_layout_resnet18_params_then_buffers(resnet):
    layout = FlatLayout.of(resnet)
    flags = [s.is_param for s in layout.slots]
    first_buffer = flags.index(False)
    assert all(flags[:first_buffer]) and not any(flags[first_buffer:])
    names = [s.name for s in layout.slots]
    assert not any("num_batches_tracked" in n for n in names)
    buffers = [s for s in layout.slots if not s.is_param]
    assert buffers and all(s.name.endswith(("running_mean", "running_var")) for s in buffers)
    n_bn_stats = sum(b.numel() for n, b in resnet.named_buffers() if n.endswith(("running_mean", "running_var")))
    assert layout.num_params == count_parameters(resnet) == sum(s.size for s in layout.slots if s.is_param)
    assert layout.size == layout.num_params + n_bn_stats
    # slots tile [0, size) without gaps or overlaps
    offset = 0
    for s in layout.slots:
        assert s.offset == offset and s.size == int(np.prod(s.shape))
        offset += s.size
    assert offset == layout.size
    # parameter slices only cover parameters
    assert layout.param_slices()[-1][1].stop == layout.num_params


def test_get_flat_values_match_state_dict(resnet):
    layout = FlatLayout.of(resnet)
    vec = get_flat(resnet, layout)
    assert vec.dtype == np.float32 and vec.shape == (layout.size,) and vec.flags.c_contiguous
    state = resnet.state_dict()
    for s in layout.slots:
        np.testing.assert_array_equal(vec[s.offset:s.offset + s.size], state[s.name].numpy().reshape(-1))


def test_get_flat_into_out_buffer():
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[3])
    layout = FlatLayout.of(model)
    out = np.full(layout.size, np.nan, np.float32)
    res = get_flat(model, layout, out=out)
    assert res is out and np.isfinite(out).all()


def test_get_set_flat_round_trip_with_read_only_input(resnet):
    layout = FlatLayout.of(resnet)
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(layout.size).astype(np.float32)
    vec[layout.num_params:] = np.abs(vec[layout.num_params:])  # plausible variances
    vec.flags.writeable = False  # like a zero-copy view from Ray's object store
    torch.manual_seed(1)
    other = build_model("resnet18", input_shape=(3, 32, 32), num_classes=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning escapes
        set_flat(other, layout, vec)
    back = get_flat(other, layout)
    assert back.tobytes() == vec.tobytes()
    # the model's tensors do not alias the read-only input
    assert not np.shares_memory(back, vec)
    p0 = next(other.parameters())
    assert p0.data_ptr() != torch.from_numpy(back).data_ptr()
    # integer buffers are untouched (they are not in the vector)
    assert all(int(b) == 0 for n, b in other.named_buffers() if n.endswith("num_batches_tracked"))


def test_set_flat_changes_the_function():
    torch.manual_seed(0)
    a = build_model("mlp", input_shape=(3,), num_classes=2, mlp_hidden=[4])
    torch.manual_seed(1)
    b = build_model("mlp", input_shape=(3,), num_classes=2, mlp_hidden=[4])
    x = torch.randn(5, 3)
    assert not torch.equal(a(x), b(x))
    set_flat(b, FlatLayout.of(b), get_flat(a, FlatLayout.of(a)))
    assert torch.equal(a(x), b(x))


def test_set_flat_wrong_size():
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[4])
    layout = FlatLayout.of(model)
    with pytest.raises(ValueError, match=r"flat weights have shape \(21,\), the model needs \(22,\)"):
        set_flat(model, layout, np.zeros(21, np.float32))
    with pytest.raises(ValueError, match="the model needs"):
        set_flat(model, layout, np.zeros((1, 22), np.float32))


# ------------------------------------------------------------------------------------ pretrained
def test_pretrained_path_loads_matching_tensors(tmp_path):
    torch.manual_seed(3)
    src = build_model("resnet18", input_shape=(3, 32, 32), num_classes=10)  # other class count
    path = tmp_path / "backbone.pt"
    torch.save(src.state_dict(), path)
    torch.manual_seed(4)
    fresh = build_model("resnet18", input_shape=(3, 32, 32), num_classes=7)
    torch.manual_seed(4)
    loaded = build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, pretrained_path=str(path))
    s_src, s_fresh, s_loaded = src.state_dict(), fresh.state_dict(), loaded.state_dict()
    assert torch.equal(s_loaded["conv1.weight"], s_src["conv1.weight"])
    assert torch.equal(s_loaded["layer4.1.bn2.running_var"], s_src["layer4.1.bn2.running_var"])
    assert not torch.equal(s_fresh["conv1.weight"], s_src["conv1.weight"])
    # the classifier has another shape: a new one, drawn from the seed alone (same seed, same head)
    assert s_loaded["fc.weight"].shape == (7, 512)
    torch.manual_seed(4)
    again = build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, pretrained_path=str(path)).state_dict()
    assert torch.equal(s_loaded["fc.weight"], again["fc.weight"]) and torch.equal(s_loaded["fc.bias"], again["fc.bias"])


def test_pretrained_path_missing_file(tmp_path):
    with pytest.raises(ValueError, match="field 'pretrained_path'.*does not exist"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, pretrained_path=str(tmp_path / "no.pt"))


def test_pretrained_path_empty_checkpoint_is_refused(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({}, path)
    with pytest.raises(ValueError, match="field 'pretrained_path'.*not a state_dict"):
        build_model("mlp", input_shape=(2,), num_classes=2, pretrained_path=str(path))


def test_pretrained_path_refuses_pickled_objects(tmp_path):
    # weights_only=True: a file holding arbitrary Python objects is refused, with a config error
    path = tmp_path / "objects.pt"
    torch.save({"conv1.weight": argparse.Namespace(a=1)}, path)
    with pytest.raises(ConfigError, match="field 'pretrained_path'.*not a loadable state_dict.*weights_only=True"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, pretrained_path=str(path))


def test_pretrained_path_not_a_torch_file(tmp_path):
    path = tmp_path / "text.pt"
    path.write_text("hello")
    with pytest.raises(ConfigError, match="field 'pretrained_path'.*not a loadable state_dict"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, pretrained_path=str(path))


def test_pretrained_path_holding_a_tensor(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(ConfigError, match="holds a Tensor, not a state_dict"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, pretrained_path=str(path))


def test_model_errors_are_config_errors():
    # the CLI reports ConfigError as a one-line error (exit 2) instead of a traceback
    with pytest.raises(ConfigError):
        build_model("cnn", input_shape=(2,), num_classes=2)


# ------------------------------------- pretrained checkpoints: strict backbone, wrappers, prefixes
def _resnet_state(seed: int, num_classes: int = 10) -> dict:
    torch.manual_seed(seed)
    return build_model("resnet18", input_shape=(3, 32, 32), num_classes=num_classes).state_dict()


@pytest.mark.parametrize("wrap", ["plain", "module-prefix", "state_dict", "model", "state_dict+prefix"])
def test_pretrained_path_accepts_wrapped_and_prefixed_checkpoints(tmp_path, wrap):
    state = _resnet_state(11)
    if "prefix" in wrap:
        state = {f"module.{k}": v for k, v in state.items()}
    saved = {"plain": state, "module-prefix": state, "state_dict": {"state_dict": state, "epoch": 3},
             "model": {"model": state}, "state_dict+prefix": {"state_dict": state}}[wrap]
    path = tmp_path / "ckpt.pt"
    torch.save(saved, path)
    loaded = build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, pretrained_path=str(path)).state_dict()
    ref = _resnet_state(11)
    for k, v in loaded.items():
        if not k.startswith("fc."):
            assert torch.equal(v, ref[k]), k


def test_pretrained_path_same_class_count_loads_the_classifier_too(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save(_resnet_state(5, num_classes=7), path)
    loaded = build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, pretrained_path=str(path)).state_dict()
    assert torch.equal(loaded["fc.weight"], _resnet_state(5, num_classes=7)["fc.weight"])


@pytest.mark.parametrize("damage,named", [
    (lambda s: {k: v for k, v in s.items() if k != "layer2.0.conv1.weight"}, "missing layer2.0.conv1.weight"),
    (lambda s: {**s, "layer1.0.conv1.weight": torch.zeros(64, 64, 1, 1)}, "wrong shape layer1.0.conv1.weight"),
    (lambda s: {f"backbone.{k}": v for k, v in s.items()}, "not in the model backbone.conv1.weight"),
    (lambda s: {**s, "projector.0.weight": torch.zeros(2, 2)}, "not in the model projector.0.weight"),
])
def test_pretrained_path_refuses_mismatched_backbone_keys(tmp_path, damage, named):
    path = tmp_path / "ckpt.pt"
    torch.save(damage(_resnet_state(2)), path)
    with pytest.raises(ConfigError, match=f"field 'pretrained_path'.*does not match the model's backbone.*{named}"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, pretrained_path=str(path))


def test_pretrained_path_with_no_matching_key_is_refused(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(3, 3)}, path)
    with pytest.raises(ConfigError, match="missing conv1.weight"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, pretrained_path=str(path))


# --------------------------------------------------- torchvision models by name, weights offline
@pytest.mark.parametrize("name,features", [("resnet50", 2048), ("convnext_tiny", 768), ("efficientnet_b0", 1280)])
def test_torchvision_models_by_name(name, features):
    torch.manual_seed(0)
    model = build_model(name, input_shape=(3, 32, 32), num_classes=5)
    model.eval()
    x = torch.rand(2, 3, 32, 32)
    assert model(x).shape == (2, 5)
    assert encode(model, x).shape == (2, features)


def _random_state(member) -> dict:
    """A random state dict of ``member``'s architecture (1000 classes)."""
    from torchvision.models import get_model

    torch.manual_seed(123)
    name = member.__class__.__name__.replace("_Weights", "").lower()
    quick = {"init_weights": False} if name in ("googlenet", "inception_v3") else {}  # their files' keys, no slow init
    state = get_model(name, weights=None, **quick).state_dict()
    return {k: (torch.randn_like(v) if v.is_floating_point() else v) for k, v in state.items()}


def _published_weights_file(torch_home, member, monkeypatch, state=None) -> tuple[dict, object]:
    """``state`` (default: a random state dict of ``member``'s architecture) saved in
    ``$TORCH_HOME/hub/checkpoints`` under a torchvision-style name whose hash prefix is the file's
    own SHA-256 (``member``'s URL patched to that name, for fedtune and torchvision alike)."""
    import hashlib

    from fedtune.weight_files import weights_file

    state = _random_state(member) if state is None else state
    staging = torch_home / "staging.pth"
    torch.save(state, staging)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()[:8]
    url = member.url
    monkeypatch.setattr(member.value, "url", url[:url.rindex("-") + 1] + digest + ".pth")
    path = weights_file(member)
    assert str(path).startswith(str(torch_home)) and path.name.endswith(f"-{digest}.pth")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(path)
    return state, path


def test_torchvision_weights_load_bit_for_bit_from_torch_home(tmp_path, monkeypatch):
    from torchvision.models import ResNet18_Weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state, _ = _published_weights_file(tmp_path, ResNet18_Weights.IMAGENET1K_V1, monkeypatch)
    torch.manual_seed(0)
    model = build_model("resnet18", input_shape=(3, 64, 64), num_classes=7, weights="IMAGENET1K_V1")
    got = model.state_dict()
    for k, v in state.items():
        if not k.startswith("fc."):
            assert torch.equal(got[k], v), k
    assert got["fc.weight"].shape == (7, 512)  # the classifier is replaced for the dataset's classes
    # DEFAULT names the same file for resnet18
    again = build_model("resnet18", input_shape=(3, 64, 64), num_classes=7, weights="DEFAULT").state_dict()
    assert torch.equal(again["layer3.0.conv1.weight"], state["layer3.0.conv1.weight"])


def test_missing_weights_file_error_names_file_and_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr("torch.hub.load_state_dict_from_url",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    with pytest.raises(ConfigError) as info:
        build_model("resnet18", input_shape=(3, 64, 64), num_classes=7, weights="IMAGENET1K_V1")
    msg = str(info.value)
    assert "\n" not in msg
    assert "resnet18-f37072fd.pth" in msg and str(tmp_path / "hub" / "checkpoints") in msg
    assert "pretrained_path" in msg


def test_weights_errors(tmp_path):
    with pytest.raises(ConfigError, match="'IMAGENET9K' is not a weight set of resnet18; allowed: none, DEFAULT, IMAGENET1K_V1"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, weights="IMAGENET9K")
    with pytest.raises(ConfigError, match="model 'cnn' has no pretrained weights"):
        build_model("cnn", input_shape=(3, 32, 32), num_classes=2, weights="DEFAULT")
    with pytest.raises(ConfigError, match="take RGB input"):
        build_model("resnet18", input_shape=(1, 32, 32), num_classes=2, weights="DEFAULT")


def test_a_weights_file_holding_objects_is_refused_before_torchvision_unpickles_it(tmp_path, monkeypatch):
    from torchvision.models import ResNet18_Weights

    from fedtune.weight_files import weights_file

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    _, path = _published_weights_file(tmp_path, ResNet18_Weights.IMAGENET1K_V1, monkeypatch,
                                      state={"conv1.weight": argparse.Namespace(a=1)})
    assert path == weights_file(ResNet18_Weights.IMAGENET1K_V1)
    with pytest.raises(ConfigError, match=f"field 'weights': .*{path.name} is not a plain state dict"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, weights="IMAGENET1K_V1")


# ------------------------------------ torchvision's published file: its name's SHA-256 prefix
def test_a_hub_file_whose_hash_does_not_match_its_name_is_refused(tmp_path, monkeypatch):
    from torchvision.models import ResNet18_Weights

    from fedtune.weight_files import weights_file

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = weights_file(ResNet18_Weights.IMAGENET1K_V1)  # resnet18-f37072fd.pth, torchvision's own name
    path.parent.mkdir(parents=True)
    torch.save(_random_state(ResNet18_Weights.IMAGENET1K_V1), path)  # loads, but is not torchvision's file
    with pytest.raises(ConfigError) as info:
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, weights="IMAGENET1K_V1")
    msg = str(info.value)
    assert "\n" not in msg and "is not torchvision's published resnet18 IMAGENET1K_V1 file" in msg
    assert "the name says f37072fd" in msg and "pretrained_path" in msg
    with pytest.raises(ConfigError, match="not torchvision's published"):  # the config refuses it before launch
        FederatedRunConfig.from_dict({"dataset": "rotated-digits", "model": "resnet18", "weights": "IMAGENET1K_V1"})


def test_check_published_hash_compares_the_streamed_sha256_with_the_name(tmp_path):
    import hashlib

    from fedtune.weight_files import check_published_hash

    body = bytes(range(256)) * 5000  # > 1 MiB: read in blocks
    digest = hashlib.sha256(body).hexdigest()
    for name, ok in [(f"m-{digest[:8]}.pth", True), (f"m-{digest[:12]}.pth", True), ("m-0badc0de.pth", False),
                     ("plain.pth", True)]:  # a name without a hash prefix is not checked
        path = tmp_path / name
        path.write_bytes(body)
        if ok:
            check_published_hash(path, "m", "V1")
        else:
            with pytest.raises(ConfigError, match=f"SHA-256 starts {digest[:8]}, the name says 0badc0de"):
                check_published_hash(path, "m", "V1")


def test_a_hub_file_of_another_architecture_is_one_line(tmp_path, monkeypatch):
    from torchvision.models import ResNet18_Weights, ResNet34_Weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    _published_weights_file(tmp_path, ResNet18_Weights.IMAGENET1K_V1, monkeypatch,
                            state=_random_state(ResNet34_Weights.IMAGENET1K_V1))
    with pytest.raises(ConfigError) as info:
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=7, weights="IMAGENET1K_V1")
    assert "\n" not in str(info.value) and "does not hold resnet18's weights" in str(info.value)


# ------------------------------------------- the same weights by two routes: the seed decides the head
@pytest.mark.parametrize("head", [{}, {"head": "projector", "proj_dim": 6}])
def test_weights_and_pretrained_path_give_the_same_model_for_a_seed(tmp_path, monkeypatch, head):
    from torchvision.models import MobileNet_V3_Small_Weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    _, path = _published_weights_file(tmp_path, MobileNet_V3_Small_Weights.IMAGENET1K_V1, monkeypatch)
    built, after = {}, {}
    for route, seed in [("weights", 0), ("path", 0), ("weights", 1), ("path", 1)]:
        torch.manual_seed(seed)
        kw = {"weights": "IMAGENET1K_V1"} if route == "weights" else {"pretrained_path": str(path)}
        built[route, seed] = build_model("mobilenet_v3_small", input_shape=(3, 32, 32), num_classes=7, **kw, **head).state_dict()
        after[route, seed] = torch.rand(3)  # the global RNG moves by the same draws on both routes
    for seed in (0, 1):
        a, b = built["weights", seed], built["path", seed]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), seed
        assert torch.equal(after["weights", seed], after["path", seed])
    head_keys = [k for k in built["path", 0] if k.startswith("classifier.3.")]
    assert head_keys and all(not torch.equal(built["path", 0][k], built["path", 1][k])
                             for k in head_keys if k.endswith("weight"))
    assert torch.equal(built["path", 0]["features.0.0.weight"], built["path", 1]["features.0.0.weight"])


# ------------------------------------------------------------ model problems found before launch
def test_a_model_too_big_for_the_input_is_refused_before_launch():
    from fedtune.runtime.driver import build_plan

    cfg = FederatedRunConfig.from_dict({"dataset": "rotated-digits", "model": "alexnet", "rounds": 1})
    with pytest.raises(ConfigError) as info:
        build_plan(cfg)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("field 'model': alexnet does not run on 1x28x28 images")
    assert "allowed: image_size >= 63 (field 'image_size')" in msg


@pytest.mark.parametrize("name,side,allowed", [("alexnet", 8, "image_size >= 63"), ("vit_b_16", 32, "image_size 224"),
                                               ("alexnet", 64, None), ("squeezenet1_0", 32, None)])
def test_check_model_runs_names_the_sides_that_run(name, side, allowed):
    from fedtune.model_check import check_model_runs

    if allowed is None:
        check_model_runs(name, (3, side, side), 5, {})
        return
    with pytest.raises(ConfigError, match=f"field 'model': {name} does not run on 3x{side}x{side} .*allowed: {allowed} "):
        check_model_runs(name, (3, side, side), 5, {})


def test_squeezenet_with_weights_is_refused_before_the_file_is_requested(tmp_path, monkeypatch):
    from fedtune.model_check import check_model_runs

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr("torch.hub.load_state_dict_from_url", lambda *a, **k: pytest.fail("weights requested"))
    with pytest.raises(ConfigError, match="field 'model': squeezenet1_0 has no linear classifier .*resnet18"):
        FederatedRunConfig.from_dict({"dataset": "rotated-digits", "model": "squeezenet1_0", "weights": "DEFAULT"})
    for head in ({"head": "projector"}, {"head": "probabilistic", "z_dim": 4}):
        with pytest.raises(ConfigError, match="squeezenet1_0 has no linear classifier"):
            check_model_runs("squeezenet1_0", (3, 64, 64), 5, head)
    ckpt = tmp_path / "sq.pt"
    torch.save(build_model("squeezenet1_0", input_shape=(3, 64, 64), num_classes=5).state_dict(), ckpt)
    with pytest.raises(ConfigError, match="squeezenet1_0 has no linear classifier"):
        check_model_runs("squeezenet1_0", (3, 64, 64), 5, {}, pretrained_path=str(ckpt))


def test_a_mismatched_checkpoint_is_refused_before_launch_on_the_meta_device(tmp_path):
    from fedtune.model_check import check_model_runs

    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save(build_model("mobilenet_v3_small", input_shape=(3, 64, 64), num_classes=10).state_dict(), good)
    torch.save({"weight": torch.zeros(2)}, bad)
    check_model_runs("mobilenet_v3_small", (3, 64, 64), 5, {}, pretrained_path=str(good))
    with pytest.raises(ConfigError, match="field 'pretrained_path'.*does not match the model's backbone"):
        check_model_runs("mobilenet_v3_small", (3, 64, 64), 5, {}, pretrained_path=str(bad))


def test_pretrained_path_naming_a_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'pretrained_path': '.*' is a directory; allowed: a checkpoint file"):
        build_model("mlp", input_shape=(2,), num_classes=2, pretrained_path=str(tmp_path))


@pytest.mark.parametrize("name,side", [("googlenet", 32), ("inception_v3", 75)])
def test_auxiliary_classifier_models_train_to_one_tensor_of_logits(name, side):
    with torch.device("meta"):
        model = build_model(name, input_shape=(3, side, side), num_classes=5).train()
        out = model(torch.empty(2, 3, side, side))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5)


# ------------------------------------------------------------------------------- frozen batch norm
def _bn_step(model: torch.nn.Module) -> None:
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    torch.nn.functional.cross_entropy(model(x), torch.arange(8) % 3).backward()
    opt.step()


def test_frozen_batchnorm_keeps_running_statistics_and_trains_scale_and_shift():
    import copy

    from fedtune.models import build_model, freeze_batchnorm

    torch.manual_seed(0)
    free = build_model("resnet18", input_shape=(3, 16, 16), num_classes=3)
    frozen = freeze_batchnorm(copy.deepcopy(free))
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    twin = copy.deepcopy(frozen)  # a deep copy (GFM's, MOON's frozen models) keeps the behaviour
    for m in (free, frozen, twin):
        _bn_step(m)
    for model, kept in ((frozen, True), (twin, True), (free, False)):
        state = model.state_dict()
        assert torch.equal(state["bn1.running_mean"], before["bn1.running_mean"]) is kept
        assert torch.equal(state["bn1.num_batches_tracked"], before["bn1.num_batches_tracked"]) is kept
        assert not torch.equal(state["bn1.weight"], before["bn1.weight"])  # the affine part trains
        assert model.training and model.conv1.training and model.bn1.training is not kept


def test_freeze_batchnorm_reaches_the_clients_of_a_run(tmp_path):
    from tests.data.test_split_file import tree

    from fedtune.config import FederatedRunConfig
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    root = tree(tmp_path / "ds")
    losses = {}
    for frozen in (False, True):
        cfg = FederatedRunConfig.from_dict({
            "dataset": "folder", "data_root": str(root), "image_size": 16, "rounds": 1, "local_steps": 2,
            "batch_size": 4, "model": "resnet18", "backend": "local", "output": str(tmp_path / "out"),
            "name": f"f{frozen}", "cache_dir": str(tmp_path / "cache"), "freeze_batchnorm": frozen,
            "oracle_fraction": 0.0})
        assert run(cfg, progress=False).status == "completed"
        (row,) = load(tmp_path / "out" / f"f{frozen}", "rounds").to_pylist()
        losses[frozen] = row["train_loss"]
    assert losses[True] != losses[False]  # batch statistics vs the running ones: another loss


# ------------------------------------------------------------- good weights load without a warning
def test_good_weights_by_either_route_load_and_pass_the_check_without_a_warning(tmp_path, monkeypatch):
    # the pre-launch check builds the model on the meta device: loading pretrained_path's tensors there
    # made torch warn once per tensor (120 for resnet18) that the copy is a no-op
    from torchvision.models import ResNet18_Weights

    from fedtune.model_check import check_model_runs

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state, path = _published_weights_file(tmp_path, ResNet18_Weights.IMAGENET1K_V1, monkeypatch)
    monkeypatch.setattr("fedtune.model_check._PASSED", set())  # the check runs, whatever ran before
    for kw in ({"weights": "IMAGENET1K_V1"}, {"pretrained_path": str(path)}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_model_runs("resnet18", (3, 64, 64), 7, {}, **kw)
            model = build_model("resnet18", input_shape=(3, 64, 64), num_classes=7, **kw)
        assert [str(w.message)[:120] for w in caught] == [], kw
        got = model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in state.items() if not k.startswith("fc.")), kw


@pytest.mark.parametrize("name,side", [("googlenet", 32), ("inception_v3", 75)])
def test_auxiliary_classifier_models_load_their_published_weights_without_a_warning(tmp_path, monkeypatch, name, side):
    # torchvision refuses aux_logits=False with weights (a ValueError traceback in every worker before);
    # its files hold the auxiliary classifiers, which the model drops after loading, as torchvision does
    from torchvision.models import get_model_weights

    from fedtune.model_check import check_model_runs

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state, _ = _published_weights_file(tmp_path, get_model_weights(name).IMAGENET1K_V1, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_model_runs(name, (3, side, side), 5, {}, weights="IMAGENET1K_V1")
        model = build_model(name, input_shape=(3, side, side), num_classes=5, weights="IMAGENET1K_V1")
    assert [str(w.message)[:120] for w in caught] == []
    got = model.state_dict()
    aux = ("aux1.", "aux2.", "AuxLogits.")
    assert not any(k.startswith(aux) for k in got) and any(k.startswith(aux) for k in state)
    assert all(torch.equal(got[k], v) for k, v in state.items() if not k.startswith(("fc.", *aux)))
    assert got["fc.weight"].shape[0] == 5
    out = model.train()(torch.rand(2, 3, side, side))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5)
