"""The typed training configuration and its presets.

One ``TrainConfig`` dataclass holds every knob of a training run, each field with a comment
giving its unit and why it has its default. Three presets fill it in:

* ``seed``: the original blog recipe, reproduced exactly (simple_cnn, SGD lr 0.01 momentum 0.9,
  batch 64, 10 epochs, no augmentation, no label smoothing, no EMA, constant learning rate).
* ``fast``: our GPU time-to-accuracy recipe (aim: 94% CIFAR-10 test accuracy in seconds on one
  A100/H100-class GPU): ``fast_resnet`` with a patch-whitening stem, scale-free BatchNorm, label
  smoothing, weight EMA, flip + translate on the device, flip test-time augmentation, a batch of
  1024, bf16 autocast and channels_last.
* ``cpu``: the same ideas sized for two CPU cores, for local runs and demos.

``make_config(preset, overrides)`` applies overrides by field name; strings from the command line
(``cifar10-kfp train --set key=value``) are parsed by the field's type. An unknown key is a
``ValueError`` naming it and listing the valid ones. The pipeline parameters that set a field
carry the field's name (``cifar10_kfp.params``).
"""

from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import asdict, dataclass, fields

PRESET_NAMES = ("seed", "fast", "cpu")


@dataclass
class TrainConfig:
    # --- what is trained --------------------------------------------------------------------
    preset: str = "seed"  # the preset these values started from; informational, kept in model.json
    architecture: str = "simple_cnn"  # model registry name (cifar10_kfp.train.models.available_models())
    widths: tuple[int, ...] = ()  # channel widths of fast_resnet's three stages; () = the model's default
    bn_momentum: float = (
        0.4  # fast_resnet BatchNorm running-stat momentum (PyTorch convention); fast for short runs
    )
    head_scale: float = 1 / 8  # fast_resnet logit multiplier: a soft initial softmax keeps early steps stable
    whiten: bool = True  # fast_resnet: set the 2x2 stem from the train set's patch covariance before step 0
    whiten_samples: int = 5000  # images used to estimate that covariance; more adds nothing measurable

    # --- optimisation ------------------------------------------------------------------------
    epochs: int = 10  # passes over the training split
    batch_size: int = 64  # GLOBAL images per step, split evenly across DDP ranks; last partial batch dropped
    lr: float = 0.01  # peak SGD learning rate for the mean loss over the batch (PyTorch semantics)
    momentum: float = 0.9  # SGD momentum
    nesterov: bool = False  # Nesterov momentum; a little better for short large-batch runs
    weight_decay: float = 0.0  # L2 coefficient, PyTorch SGD semantics (added to the gradient)
    lr_schedule: str = "constant"  # "constant" or "linear": linear warm-up to lr, then linear decay
    warmup_epochs: float = 0.0  # length of the linear warm-up, in epochs (fractions allowed)
    start_lr_fraction: float = 0.1  # warm-up starts at lr * this
    final_lr_fraction: float = 0.0  # the decay ends at lr * this on the last step
    label_smoothing: float = 0.0  # cross-entropy label smoothing; 0.2 helps short runs of fast_resnet
    ema_decay: float = 0.0  # per-step decay of the weight EMA (0 = off); the EMA is evaluated and exported
    ema_every: int = 5  # update the EMA every this many steps (decay compounded), to keep its cost small
    ema_start_epoch: int = 0  # the EMA copies the live weights until this epoch (early weights are noise)

    # --- data path (all on the device, batched) ----------------------------------------------
    flip: bool = False  # random horizontal flip, p = 1/2
    translate: int = 0  # random shift in pixels per axis, reflect-filled (= pad + random crop); 0 = off
    tta: bool = False  # evaluate with test-time flip augmentation (mean of the logits of x and flip(x))
    eval_split: str = "val"  # split evaluated after every epoch; "val" falls back to "test" when val is empty
    eval_batch_size: int = 1024  # images per evaluation step; memory only, no effect on results

    # --- where the training data is read from (docs/configuration.md, "Data path") ---------------
    data_path: str = (
        "auto"  # "auto": in memory if it fits memory_budget_gb, else streamed; "memory"; "stream"
    )
    stream_partitions: int = (
        1  # streamed: fixed shard partitions; each of W ranks reads P/W, so W must divide P
    )
    shuffle_buffer: int = (
        4096  # streamed: samples shuffled together per partition (rounded up to whole shards)
    )
    memory_budget_gb: float = 0.0  # "auto": most the in-memory path may take; 0 = half this machine's memory

    # --- runtime -----------------------------------------------------------------------------
    seed: int = 0  # seeds init, data order and augmentation; same seed -> same result (bitwise on CPU)
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:N"
    amp: bool = True  # bf16 autocast on CUDA; ignored on CPU, which always runs fp32
    amp_dtype: str = "bfloat16"  # "bfloat16" (no loss scaling needed) or "float16" (uses a GradScaler)
    channels_last: bool = False  # NHWC memory format: faster convs on tensor cores and oneDNN
    compile: bool = False  # torch.compile the model (CUDA); pays a warm-up of tens of seconds
    deterministic: bool = True  # torch.use_deterministic_algorithms; on CUDA also disables cudnn.benchmark
    threads: int = 0  # torch.set_num_threads for the run on CPU; 0 = leave PyTorch's default
    checkpoint_every: int = (
        1  # write a checkpoint every this many epochs (and always at the end); 0 = end only
    )
    checkpoint_every_steps: int = 0  # also every this many global steps, inside epochs too; 0 = off
    checkpoint_every_s: float = 0.0  # also when this many seconds passed since the last one; 0 = off
    keep_checkpoints: int = 2  # checkpoints kept under the prefix; older ones are deleted
    progress: bool = True  # print the per-epoch progress line (rank 0)

    # fields that change how a run executes but not what it computes; left out of config_hash()
    RUNTIME_FIELDS: typing.ClassVar[frozenset[str]] = frozenset(
        {
            "device",
            "compile",
            "threads",
            "checkpoint_every",
            "checkpoint_every_steps",
            "checkpoint_every_s",
            "keep_checkpoints",
            "progress",
            "eval_batch_size",
            "memory_budget_gb",
        }
    )
    # the data-path fields at their defaults are left out of config_hash(), so that the hashes (and so
    # the default checkpoint prefixes) of configs written before these fields existed stay the same
    DATA_PATH_DEFAULTS: typing.ClassVar[dict] = {
        "data_path": "auto",
        "stream_partitions": 1,
        "shuffle_buffer": 4096,
    }

    def __post_init__(self) -> None:
        self.widths = tuple(int(w) for w in self.widths)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field with an impossible value."""
        checks = [
            ("epochs", self.epochs >= 1, ">= 1"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("lr", self.lr > 0, "> 0"),
            ("momentum", 0 <= self.momentum < 1, "in [0, 1)"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("lr_schedule", self.lr_schedule in ("constant", "linear"), "'constant' or 'linear'"),
            ("warmup_epochs", 0 <= self.warmup_epochs <= self.epochs, "in [0, epochs]"),
            ("start_lr_fraction", 0 <= self.start_lr_fraction <= 1, "in [0, 1]"),
            ("final_lr_fraction", 0 <= self.final_lr_fraction <= 1, "in [0, 1]"),
            ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
            ("ema_decay", 0 <= self.ema_decay < 1, "in [0, 1)"),
            ("ema_every", self.ema_every >= 1, ">= 1"),
            ("translate", self.translate >= 0, ">= 0"),
            ("eval_split", self.eval_split in ("val", "test", "train"), "'val', 'test' or 'train'"),
            ("eval_batch_size", self.eval_batch_size >= 1, ">= 1"),
            ("amp_dtype", self.amp_dtype in ("bfloat16", "float16"), "'bfloat16' or 'float16'"),
            (
                "device",
                self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                "auto/cpu/cuda",
            ),
            ("threads", self.threads >= 0, ">= 0"),
            ("checkpoint_every", self.checkpoint_every >= 0, ">= 0"),
            ("checkpoint_every_steps", self.checkpoint_every_steps >= 0, ">= 0"),
            ("checkpoint_every_s", self.checkpoint_every_s >= 0, ">= 0"),
            ("keep_checkpoints", self.keep_checkpoints >= 1, ">= 1"),
            ("whiten_samples", self.whiten_samples >= 1, ">= 1"),
            ("bn_momentum", 0 < self.bn_momentum <= 1, "in (0, 1]"),
            ("data_path", self.data_path in ("auto", "memory", "stream"), "'auto', 'memory' or 'stream'"),
            ("stream_partitions", self.stream_partitions >= 1, ">= 1"),
            ("shuffle_buffer", self.shuffle_buffer >= 1, ">= 1"),
            ("memory_budget_gb", self.memory_budget_gb >= 0, ">= 0 (0 = half this machine's memory)"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"invalid training config: {name}={getattr(self, name)!r} must be {rule}")

    # -- derived views ----------------------------------------------------------------------

    def model_config(self) -> dict:
        """Keyword arguments for ``build_model`` (stored in checkpoints and model.json)."""
        if self.architecture == "fast_resnet":
            out: dict[str, typing.Any] = {"bn_momentum": self.bn_momentum, "head_scale": self.head_scale}
            if self.widths:
                out["widths"] = list(self.widths)
            return out
        if self.widths:
            raise ValueError(
                f"invalid training config: widths={list(self.widths)} applies to fast_resnet only"
            )
        return {}

    def to_dict(self) -> dict:
        """Plain JSON types (tuples become lists)."""
        out = asdict(self)
        out["widths"] = list(self.widths)
        return out

    def config_hash(self, length: int = 12) -> str:
        """Short hash of everything that decides what is computed (runtime-only fields excluded)."""
        semantic = {k: v for k, v in self.to_dict().items() if k not in self.RUNTIME_FIELDS and k != "preset"}
        for key, default in self.DATA_PATH_DEFAULTS.items():
            if semantic[key] == default:
                del semantic[key]
        return hashlib.sha256(json.dumps(semantic, sort_keys=True).encode()).hexdigest()[:length]

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        return make_config(values.get("preset", "seed"), values)


def field_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


# ---------------------------------------------------------------------------- presets

PRESETS: dict[str, dict] = {
    # The blog recipe, exactly: no augmentation, no smoothing, no EMA, constant lr, fp32.
    "seed": dict(
        preset="seed", architecture="simple_cnn", epochs=10, batch_size=64, lr=0.01, momentum=0.9,
        nesterov=False, weight_decay=0.0, lr_schedule="constant", label_smoothing=0.0, ema_decay=0.0,
        flip=False, translate=0, tta=False, amp=False, channels_last=False,
    ),
    # GPU time-to-94%: big batch, short linear schedule, everything batched on the device.
    "fast": dict(
        preset="fast", architecture="fast_resnet", widths=(64, 256, 256), epochs=10, batch_size=1024,
        lr=1.0, momentum=0.85, nesterov=True, weight_decay=5e-5, lr_schedule="linear", warmup_epochs=2.0,
        start_lr_fraction=0.1, final_lr_fraction=0.05, label_smoothing=0.2, ema_decay=0.95, ema_every=5,
        ema_start_epoch=2, flip=True, translate=2, tta=True, amp=True, channels_last=True,
        deterministic=False, checkpoint_every=2,
    ),
    # Two CPU cores: a narrow fast_resnet, channels_last (oneDNN), fp32, smaller batch for more steps.
    "cpu": dict(
        preset="cpu", architecture="fast_resnet", widths=(32, 64, 128), epochs=12, batch_size=256,
        lr=0.4, momentum=0.85, nesterov=True, weight_decay=1e-4, lr_schedule="linear", warmup_epochs=1.0,
        start_lr_fraction=0.1, final_lr_fraction=0.05, label_smoothing=0.2, ema_decay=0.9, ema_every=5,
        ema_start_epoch=2, flip=True, translate=2, tta=True, amp=False, channels_last=True,
    ),
}  # fmt: skip


# ---------------------------------------------------------------------------- parsing


def _field_type(name: str):
    hints = typing.get_type_hints(TrainConfig)
    return hints[name]


def parse_value(name: str, raw):
    """Convert ``raw`` (a string from the command line, or a JSON value) to field ``name``'s type."""
    kind = _field_type(name)
    origin = typing.get_origin(kind)
    try:
        if origin is tuple or kind is tuple:
            if isinstance(raw, str):
                raw = [part for part in raw.replace("x", ",").split(",") if part.strip()]
            return tuple(int(v) for v in raw)
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, (int, float)) and raw in (0, 1):
                return bool(raw)
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true/false")
        if kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError("expected an integer")
            if isinstance(raw, bool):
                raise ValueError("expected an integer")
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError("expected a number")
            return float(raw)
        if kind is str:
            if not isinstance(raw, str):
                raise ValueError("expected a string")
            return raw
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid value for training config field {name!r}: {raw!r} ({exc})") from None
    raise TypeError(f"unsupported field type {kind!r} for {name}")  # pragma: no cover


def make_config(preset: str, overrides: dict | None = None) -> TrainConfig:
    """A preset with ``overrides`` applied. Unknown keys or bad values raise ``ValueError``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose one of {list(PRESET_NAMES)}")
    overrides = dict(overrides or {})
    valid = field_names()
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown training config key(s) {unknown}: valid keys are {valid}")
    values = dict(PRESETS[preset])
    for name, raw in overrides.items():
        values[name] = parse_value(name, raw)
    _follow_overrides(values, overrides)
    values["preset"] = preset if "preset" not in overrides else values["preset"]
    return TrainConfig(**values)


def _follow_overrides(values: dict, overrides: dict) -> None:
    """Keep a preset's dependent defaults consistent with what the caller overrode.

    The preset's warm-up never outlasts a shorter run (``fast`` with ``epochs=1`` warms up for the
    whole run), and its ``fast_resnet`` widths do not carry over to another architecture. Values the
    caller set explicitly are left alone, for ``validate`` to judge.
    """
    if "epochs" in overrides and "warmup_epochs" not in overrides:
        values["warmup_epochs"] = min(float(values.get("warmup_epochs", 0.0)), float(values["epochs"]))
    if "widths" not in overrides and values.get("architecture", "simple_cnn") != "fast_resnet":
        values.pop("widths", None)


__all__ = [
    "PRESETS",
    "PRESET_NAMES",
    "TrainConfig",
    "make_config",
    "parse_value",
    "field_names",
]
