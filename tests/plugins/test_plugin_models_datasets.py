"""Your own model and dataset (issue 45, item 4): ``model: MODULE:FUNCTION`` (a factory of input
shape and class count, through the same pre-launch checks as the built-ins) and a plugin's
``DatasetSpec`` of named domains (``fedtune partition``, ``fedtune datasets``, every setting, both
backends, the image cache where it yields image files)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.cli import main
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError, DataError
from fedtune.errors import PluginError
from fedtune.plugins import check_plugin_records, load_plugins, plugin_records
from fedtune.runtime.driver import build_plan, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODULE = "ft_md_plugin"
PLUGIN = '''
import os

import numpy as np
import torch
from torch import nn

import fedtune


class Blobs(fedtune.DomainDataset):
    """Three domains of 40 six-feature vectors, 3 classes (class mean + a domain shift)."""

    def __init__(self, data_seed, name="md-blobs"):
        rng = np.random.default_rng(data_seed)
        self.info = fedtune.DatasetInfo(name, ("north", "south", "east"), ("a", "b", "c"), (6,), "mlp", "fdg")
        self._x, self._y = {}, {}
        for k, d in enumerate(self.info.domains):
            y = rng.integers(0, 3, 40)
            self._x[d] = (rng.normal(size=(40, 6)) + y[:, None] + 0.3 * k).astype(np.float32)
            self._y[d] = y.astype(np.int64)

    def labels(self, domain):
        self.check_domain(domain)
        return self._y[domain].copy()

    def load(self, domain, indices):
        self.check_domain(domain)
        idx = self.check_indices(domain, indices, len(self._y[domain]))
        return np.ascontiguousarray(self._x[domain][idx]), self._y[domain][idx].copy()

    def split_pieces(self, scheme):
        idx = np.arange(40, dtype=np.int64)
        return {"train": {"north": idx, "south": idx}, "val": {}, "test": {"east": idx}, "id_val": {},
                "id_test": {}}


def images(root, image_size, data_seed):
    files, labels = {}, {}
    for d in sorted(os.listdir(root)):
        names = sorted(os.listdir(os.path.join(root, d)))
        files[d] = [d + "/" + n for n in names]
        labels[d] = [int(n.split("_")[0]) for n in names]
    return fedtune.CachedImageDataset("md-images", root, files, labels, ("zero", "one"), image_size=image_size)


class Fixed(fedtune.DomainDataset):
    def __init__(self):
        self.info = fedtune.DatasetInfo("md-fixed", ("a", "b"), ("x", "y"), (3, 8, 8), "cnn", "fdg")

    def labels(self, domain):
        return np.zeros(4, np.int64)

    def load(self, domain, indices):
        return np.zeros((len(indices), 3, 8, 8), np.float32), np.zeros(len(indices), np.int64)


def missing_files(root, image_size, data_seed):
    raise FileNotFoundError("no index.csv here")


fedtune.register(
    fedtune.DatasetSpec("md-blobs", lambda root, image_size, data_seed: Blobs(data_seed), "three blob domains"),
    fedtune.DatasetSpec("md-split", lambda root, image_size, data_seed: Blobs(data_seed, "md-split"), "own splits",
                        split_schemes=("official",)),
    fedtune.DatasetSpec("md-images", images, "png domains", needs_root=True, image_files=True),
    fedtune.DatasetSpec("md-bad-type", lambda root, image_size, data_seed: [1, 2], "a list"),
    fedtune.DatasetSpec("md-bad-name", lambda root, image_size, data_seed: Blobs(data_seed), "another name"),
    fedtune.DatasetSpec("md-bad-images", lambda root, image_size, data_seed: Blobs(data_seed, "md-bad-images"),
                        "vectors declared as image files", image_files=True),
    fedtune.DatasetSpec("md-fixed", lambda root, image_size, data_seed: Fixed(), "8 px, whatever image_size"),
    fedtune.DatasetSpec("md-raises", missing_files, "build fails"),
)


def build(input_shape, num_classes):
    """The built-in mlp with mlp_hidden [8], layer for layer (the same draws from torch's RNG)."""
    width = int(np.prod(input_shape))
    return nn.Sequential(nn.Flatten(), nn.Linear(width, 8), nn.ReLU(inplace=True), nn.Linear(8, num_classes))


NOT_CALLABLE = 3


def returns_list(input_shape, num_classes):
    return [nn.Linear(6, num_classes)]


def wrong_classes(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes + 2))


def raises(input_shape, num_classes):
    raise ValueError("this factory wants colour images")


def nine_px_kernel(input_shape, num_classes):
    """Runs on images of side >= 9 only (a 9x9 convolution without padding)."""
    return nn.Sequential(nn.Conv2d(input_shape[0], 4, 9), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, num_classes))


def no_linear(input_shape, num_classes):
    """Logits [N, num_classes] from a 1x1 convolution: no nn.Linear anywhere."""
    return nn.Sequential(nn.Unflatten(1, (input_shape[0], 1)), nn.Conv1d(input_shape[0], num_classes, 1),
                         nn.Flatten())
'''


@pytest.fixture(scope="module", autouse=True)
def _isolated():
    """Whatever this module's tests register is gone after them (fedtune.plugins.isolated)."""
    from fedtune.plugins import isolated

    with isolated():
        yield


@pytest.fixture(scope="module")
def plugin(tmp_path_factory, _isolated) -> str:
    """The plugin module's file, imported (it registers its datasets) as ``--plugin FILE`` would."""
    path = tmp_path_factory.mktemp("plugin") / f"{MODULE}.py"
    path.write_text(PLUGIN)
    load_plugins([str(path)])
    return str(path)


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """Three domains of twelve 10x10 PNGs, ``<label>_<i>.png``, the label in the red channel."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for d in ("red", "green", "blue"):
        (root / d).mkdir()
        for i in range(12):
            pixels = (rng.random((10, 10, 3)) * 255).astype(np.uint8)
            pixels[..., 0] = 200 * (i % 2)
            Image.fromarray(pixels).save(root / d / f"{i % 2}_{i}.png")
    return root


def cfg_of(tmp_path, **kw) -> FederatedRunConfig:
    base = {"dataset": "md-blobs", "rounds": 2, "local_steps": 2, "batch_size": 8, "backend": "local",
            "output": str(tmp_path)}
    return FederatedRunConfig.from_dict({**base, **kw})


def rows_of(result) -> list[tuple]:
    return [(r["round"], r["train_loss"], r["val_acc"], r["target_acc"]) for r in result.rows]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


# ------------------------------------------------------------------------------------------------ running
def test_a_factory_on_a_plugin_dataset_trains_exactly_like_the_builtin_model_it_spells_out(plugin, tmp_path):
    # The factory builds the mlp of mlp_hidden [8] layer for layer: under the run's seed it draws the same
    # initial weights, so both runs give the same rows bit for bit (the factory is called like a built-in).
    own = run(cfg_of(tmp_path, model=f"{MODULE}:build", name="own"), progress=False)
    builtin = run(cfg_of(tmp_path, model="mlp", mlp_hidden=[8], name="builtin"), progress=False)
    assert own.status == builtin.status == "completed"
    assert [r["round"] for r in own.rows] == [1, 2]
    assert rows_of(own) == rows_of(builtin)
    assert own.info["num_params"] == 6 * 8 + 8 + 8 * 3 + 3
    # ... and the run trained: the second round's loss is not the first's
    assert own.rows[0]["train_loss"] != own.rows[1]["train_loss"]


def test_the_factory_module_joins_the_runs_plugins_and_the_study_records_its_source(plugin, tmp_path, monkeypatch):
    # the module form, importable from sys.path and named nowhere else: the run's plugins gain it
    nets = tmp_path / "ft_md_nets.py"
    nets.write_text("from torch import nn\n\ndef build(input_shape, num_classes):\n"
                    "    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = cfg_of(tmp_path, model="ft_md_nets:build")
    assert cfg.plugins == ["ft_md_nets", plugin]  # the factory's module, the dataset's plugin
    (record, _) = plugin_records(cfg.plugins)
    assert record["module"] == "ft_md_nets"
    assert record["sha256"] == hashlib.sha256(b"ft_md_nets.py\0" + nets.read_bytes() + b"\0").hexdigest()
    check_plugin_records([record])
    with pytest.raises(PluginError, match="whose source has changed"):
        check_plugin_records([{**record, "sha256": "0" * 64}])
    # the file form: the factory's module is the plugin file already named, not a second entry
    assert cfg_of(tmp_path, plugins=[plugin], model=f"{MODULE}:build").plugins == [plugin]
    # the dataset's plugin is found from the registry without being named
    assert cfg_of(tmp_path).plugins == [plugin]
    # the factory's name is part of the trial id (the plugins field is not)
    assert cfg_of(tmp_path, model="ft_md_nets:build").trial_id() != cfg_of(tmp_path, model=f"{MODULE}:build").trial_id()


def test_a_factory_registered_from_main_is_refused_on_ray(plugin, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules["__main__"], "ft_md_main_build", lambda shape, n: nn.Linear(shape[0], n),
                        raising=False)
    assert cfg_of(tmp_path, model="__main__:ft_md_main_build").plugins == [plugin]  # local: runs
    with pytest.raises(ConfigError, match="registered from __main__") as e:
        cfg_of(tmp_path, model="__main__:ft_md_main_build", backend="ray")
    one_line(e.value)


@pytest.mark.parametrize("setting,algorithm,dataset", [("fdg", "fedavg", "md-blobs"), ("fl", "fedavg", "md-blobs"),
                                                        ("fda", "fedavg", "md-blobs"), ("ufdg", "simclr", "md-images")])
def test_every_setting_partitions_a_plugin_dataset(plugin, image_root, tmp_path, setting, algorithm, dataset):
    root = str(image_root) if dataset == "md-images" else None
    cfg = cfg_of(tmp_path, setting=setting, algorithm=algorithm, dataset=dataset, data_root=root, image_size=8)\
        if root else cfg_of(tmp_path, setting=setting, algorithm=algorithm, dataset=dataset)
    plan = build_plan(cfg)
    size = 12 if root else 40
    domains = ("blue", "green", "red") if root else ("north", "south", "east")
    assert plan.setting == setting and plan.domains == domains
    held = sum(len(idx) for c in plan.clients for part in (c.train, c.val, c.test) for idx in part.values())
    target = sum(len(idx) for part in (plan.target_test, plan.target_probe, plan.target_oracle) for idx in part.values())
    assert held + target == size * 3  # every example of every domain somewhere, once
    if setting != "fl":
        assert plan.target_domains == (domains[0],)


def test_a_plugin_datasets_own_split_scheme_is_its_split_pieces(plugin, tmp_path):
    plan = build_plan(cfg_of(tmp_path, dataset="md-split", split_scheme="official"))
    assert plan.split_scheme == "official" and plan.target_domains == ("east",)
    assert {d for c in plan.clients for d in c.train} == {"north", "south"}
    with pytest.raises(ConfigError, match="not a split scheme of dataset 'md-split'") as e:
        cfg_of(tmp_path, dataset="md-split", split_scheme="pac-s")
    assert "allowed: official, null" in one_line(e.value)
    with pytest.raises(ConfigError, match="not a split scheme of dataset 'md-blobs'.*allowed: null"):
        cfg_of(tmp_path, split_scheme="official")


def test_fedtune_partition_and_datasets_show_a_plugin_dataset(plugin, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich's tables: no wrapping
    assert main(["partition", "--plugin", plugin, "--dataset", "md-blobs", "--backend", "local"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("md-blobs, setting fdg, target north")
    assert lines[1].split() == ["client", "south", "east", "train", "val"]
    # val_fraction 0.2 of each source domain's 40 examples, the rest trains
    assert lines[2].split() == ["south#0", "32", "0", "32", "8"] and lines[3].split() == ["east#0", "0", "32", "32", "8"]
    assert main(["datasets", "--plugin", plugin]) == 0
    listed = capsys.readouterr().out
    assert f"three blob domains (plugin {plugin})" in next(line for line in listed.splitlines() if "md-blobs" in line)


def test_a_plugin_dataset_of_image_files_uses_the_runs_image_cache(plugin, image_root, tmp_path):
    from PIL import Image

    from fedtune.data.registry import get_dataset

    cache = tmp_path / "cache"
    cfg = cfg_of(tmp_path, dataset="md-images", data_root=str(image_root), image_size=8, model="cnn",
                 augment="domainbed", cache_dir=str(cache), rounds=1)
    result = run(cfg, progress=False)
    assert result.status == "completed"
    built = sorted(p.name.split("-8px-")[0] for p in cache.glob("*.npy"))
    assert built == ["md-images-blue", "md-images-green", "md-images-red"]  # every domain decoded once, here
    log = [json.loads(line) for line in (cache / "builds.log").read_text().splitlines()]
    assert sum(r["images"] for r in log) == 36
    # what a client reads: PIL's RGB bilinear resize to 8 px, ImageNet-normalised (written from the docs)
    ds = get_dataset("md-images", root=image_root, image_size=8, cache_dir=cache)
    x, y = ds.load("green", np.array([3]))
    with Image.open(image_root / ds.files("green")[3]) as im:
        want = np.asarray(im.convert("RGB").resize((8, 8), Image.BILINEAR), np.float64) / 255.0
    want = (want - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    np.testing.assert_allclose(x[0], want.transpose(2, 0, 1), atol=1e-5)
    assert y.tolist() == [int(ds.files("green")[3].split("/")[1][0])]
    # DomainBed's augmentation is for datasets of image files only
    with pytest.raises(ConfigError, match="field 'augment'"):
        cfg_of(tmp_path, augment="domainbed")


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("model,error,message", [
    ("ft_md_nowhere:build", PluginError, "plugin 'ft_md_nowhere' does not import: ModuleNotFoundError"),
    (f"{MODULE}:missing", ConfigError, f"module '{MODULE}' has no function 'missing'"),
    (f"{MODULE}:NOT_CALLABLE", ConfigError, "is not callable (it is of type int)"),
    (f"{MODULE}:", ConfigError, "is not allowed; allowed: cnn, mlp, a torchvision model, or a factory MODULE:FUNCTION"),
    (":build", ConfigError, "is not allowed"),
])
def test_a_factory_that_cannot_be_found_is_one_line_when_the_config_is_read(plugin, tmp_path, model, error, message):
    with pytest.raises(error) as e:
        cfg_of(tmp_path, model=model)
    text = one_line(e.value)
    assert "field 'model'" in text and message in text


@pytest.mark.parametrize("factory,message", [
    ("returns_list", "returned a list, not a torch.nn.Module"),
    ("wrong_classes", "logits of shape [2, 5] for a batch of 2 inputs, and the dataset has 3 classes; allowed: a "
                      "model whose forward returns [N, num_classes] = [N, 3] logits"),
    ("raises", "raised ValueError for input_shape (6,), num_classes 3: this factory wants colour images"),
])
def test_a_factory_whose_model_does_not_fit_the_dataset_is_refused_before_launch(plugin, tmp_path, factory, message):
    cfg = cfg_of(tmp_path, model=f"{MODULE}:{factory}")
    with pytest.raises(ConfigError) as e:
        build_plan(cfg)
    text = one_line(e.value)
    assert text.startswith("field 'model'") and f"{MODULE}:{factory}" in text and message in text


def test_a_factory_model_on_images_too_small_is_refused_naming_the_sides_that_run(plugin, image_root, tmp_path):
    cfg = cfg_of(tmp_path, dataset="md-images", data_root=str(image_root), image_size=8,
                 model=f"{MODULE}:nine_px_kernel")
    with pytest.raises(ConfigError, match="does not run on inputs of shape 3x8x8") as e:
        build_plan(cfg)
    assert "allowed: image_size >= 9 (field 'image_size')" in one_line(e.value)  # a 9x9 kernel, no padding
    build_plan(cfg_of(tmp_path, dataset="md-images", data_root=str(image_root), image_size=9,
                      model=f"{MODULE}:nine_px_kernel"))


def test_weights_are_torchvisions_and_refused_with_a_factory(plugin, tmp_path):
    with pytest.raises(ConfigError, match="field 'weights'.*your own factory.*pretrained_path") as e:
        cfg_of(tmp_path, model=f"{MODULE}:build", weights="DEFAULT")
    one_line(e.value)


@pytest.mark.parametrize("algorithm,role", [("moon", "whose input client method moon reads as the features"),
                                            ("fedsr", "for client method fedsr's probabilistic head to replace")])
def test_a_factory_without_a_linear_head_is_refused_where_the_method_needs_one(plugin, tmp_path, algorithm, role):
    with pytest.raises(ConfigError) as e:
        build_plan(cfg_of(tmp_path, algorithm=algorithm, model=f"{MODULE}:no_linear"))
    assert f"field 'model': factory {MODULE}:no_linear has no linear classifier (nn.Linear) {role}" in one_line(e.value)
    # fedavg reads nothing of the sort: the same model trains
    assert run(cfg_of(tmp_path, model=f"{MODULE}:no_linear", rounds=1), progress=False).status == "completed"


def test_a_torchvision_model_without_a_linear_head_is_refused_for_a_method_that_reads_features():
    from fedtune.model_check import check_model_runs

    check_model_runs("squeezenet1_0", (3, 64, 64), 5, {})  # plain classification: its conv classifier is fine
    with pytest.raises(ConfigError, match="squeezenet1_0 has no linear classifier .* client method coral reads"):
        check_model_runs("squeezenet1_0", (3, 64, 64), 5, {}, method="coral", reads_features=True)


def test_pretrained_path_loads_into_a_factory_model_and_another_architecture_is_refused(plugin, tmp_path):
    from fedtune.models import build_model

    torch.manual_seed(5)
    source = build_model(f"{MODULE}:build", input_shape=(6,), num_classes=3)
    good = tmp_path / "good.pt"
    torch.save(source.state_dict(), good)
    torch.manual_seed(6)
    loaded = build_model(f"{MODULE}:build", input_shape=(6,), num_classes=3, pretrained_path=str(good))
    for (name, a), b in zip(source.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name  # every tensor, the classifier too (same class count)
    other = tmp_path / "other.pt"
    torch.save(nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).state_dict(), other)
    with pytest.raises(ConfigError, match="field 'pretrained_path'.*does not match the model's backbone") as e:
        build_plan(cfg_of(tmp_path, model=f"{MODULE}:build", pretrained_path=str(other)))
    assert "wrong shape 1.weight (5, 6) vs (8, 6)" in one_line(e.value)


@pytest.mark.parametrize("dataset,kw,error,message", [
    ("md-bad-type", {}, DataError,
     "dataset 'md-bad-type' (plugin {p}): build returned a list, not a fedtune.DomainDataset"),
    ("md-bad-name", {}, DataError, "dataset 'md-bad-name' (plugin {p}): its dataset's info.name is 'md-blobs'"),
    ("md-bad-images", {}, DataError, "declares image_files=True but build returned a Blobs"),
    ("md-blobs", {"image_size": 16}, DataError, "image_size does not apply to dataset 'md-blobs' (plugin {p}), whose "
                                                "examples are vectors of shape (6,)"),
    ("md-fixed", {"image_size": 16, "model": "cnn"}, DataError, "gives images of shape (3, 8, 8) for image_size 16"),
    ("md-raises", {}, DataError, "dataset 'md-raises' (plugin {p}): build raised FileNotFoundError: no index.csv here"),
    ("md-images", {}, DataError, "dataset 'md-images' needs data_root (--data-root DIR) holding the files dataset "
                                 "'md-images' reads (plugin {p})"),
])
def test_a_plugin_dataset_that_breaks_its_contract_is_one_line_naming_it(plugin, tmp_path, dataset, kw, error,
                                                                          message):
    with pytest.raises(error) as e:
        build_plan(cfg_of(tmp_path, dataset=dataset, **kw))
    assert message.format(p=plugin) in one_line(e.value)


def test_a_public_cached_image_dataset_refuses_labels_that_do_not_fit(tmp_path):
    from fedtune.data.folder import CachedImageDataset

    with pytest.raises(DataError, match="dataset 'toy': domain 'a' needs .* whole number in 0..1") as e:
        CachedImageDataset("toy", tmp_path, {"a": ["x.png"]}, {"a": [2]}, ("c0", "c1"))
    one_line(e.value)
    with pytest.raises(DataError, match="files and labels must name the same domains"):
        CachedImageDataset("toy", tmp_path, {"a": ["x.png"]}, {"b": [0]}, ("c0", "c1"))


# ------------------------------------------------------------------------------------------------ Ray
RAY_PLUGIN = '''
import os

import numpy as np
from torch import nn

import fedtune


def _seen():
    """Where this process imported the plugin from (the test reads it back)."""
    with open(os.environ["FT_MD_MARKER"], "a") as f:
        f.write(f"{os.getpid()} {__file__}\\n")


class Blobs(fedtune.DomainDataset):
    def __init__(self, data_seed):
        rng = np.random.default_rng(data_seed)
        self.info = fedtune.DatasetInfo("md-ray-blobs", ("north", "south", "east"), ("a", "b", "c"), (6,), "mlp", "fdg")
        self._x, self._y = {}, {}
        for k, d in enumerate(self.info.domains):
            y = rng.integers(0, 3, 40)
            self._x[d] = (rng.normal(size=(40, 6)) + y[:, None] + 0.3 * k).astype(np.float32)
            self._y[d] = y.astype(np.int64)

    def labels(self, domain):
        return self._y[domain].copy()

    def load(self, domain, indices):
        idx = self.check_indices(domain, indices, len(self._y[domain]))
        return np.ascontiguousarray(self._x[domain][idx]), self._y[domain][idx].copy()


def blobs(root, image_size, data_seed):
    _seen()
    return Blobs(data_seed)


def build(input_shape, num_classes):
    _seen()
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 8), nn.Tanh(), nn.Linear(8, num_classes))


fedtune.register(fedtune.DatasetSpec("md-ray-blobs", blobs, "blobs for Ray"))
'''

RAY_DRIVER = '''
import json, sys

src, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, src)
from fedtune.plugins import load_plugins

load_plugins(["ft_md_ray"])  # the driver imports it, then nothing else can: not on the path, not installed
sys.path.remove(src)
from fedtune.config import FederatedRunConfig
from fedtune.runtime.driver import run

base = {"dataset": "md-ray-blobs", "model": "ft_md_ray:build", "rounds": 2, "local_steps": 2, "batch_size": 8,
        "output": out, "client_cpus": 0.5, "num_cpus": 2, "address": "local", "max_client_actors": 2}
got = {}
for backend in ("local", "ray"):
    cfg = FederatedRunConfig.from_dict({**base, "backend": backend, "name": backend})
    result = run(cfg, progress=False)
    got[backend] = {"status": result.status, "plugins": cfg.plugins,
                    "rows": [[r["round"], r["train_loss"], r["val_acc"], r["target_acc"]] for r in result.rows]}
print("RESULT " + json.dumps(got))
'''
