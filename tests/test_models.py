"""Models and the flat-weight layout (fedtune/models.py)."""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.layout import FlatLayout
from fedtune.models import build_model, count_parameters, encode, get_flat, set_flat


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
    # the classifier has another shape: ours is kept
    assert s_loaded["fc.weight"].shape == (7, 512)
    assert torch.equal(s_loaded["fc.weight"], s_fresh["fc.weight"])


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


def _fake_weights_file(torch_home, member) -> dict:
    """A random state dict of ``member``'s architecture (1000 classes) under torchvision's file name."""
    from torchvision.models import get_model

    from fedtune.models import weights_file

    torch.manual_seed(123)
    state = get_model(member.__class__.__name__.replace("_Weights", "").lower(), weights=None).state_dict()
    state = {k: (torch.randn_like(v) if v.is_floating_point() else v) for k, v in state.items()}
    path = weights_file(member)
    assert str(path).startswith(str(torch_home))
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    return state


def test_torchvision_weights_load_bit_for_bit_from_torch_home(tmp_path, monkeypatch):
    from torchvision.models import ResNet18_Weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    state = _fake_weights_file(tmp_path, ResNet18_Weights.IMAGENET1K_V1)
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

    from fedtune.models import weights_file

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = weights_file(ResNet18_Weights.IMAGENET1K_V1)
    path.parent.mkdir(parents=True)
    torch.save({"conv1.weight": argparse.Namespace(a=1)}, path)
    with pytest.raises(ConfigError, match="field 'weights': .*resnet18-f37072fd.pth is not a plain state dict"):
        build_model("resnet18", input_shape=(3, 32, 32), num_classes=2, weights="IMAGENET1K_V1")
