"""The one layout of a run directory's ``summary.json``, for simulated and measured runs alike.

``slidedp simulate --out``, the runtime (``Trainer``) and the benchmark scripts write it; ``slidedp report``,
``slidedp validate``/``calibrate --from-run`` and the benchmarks read it. Keeping the keys in one dataclass
means a writer cannot rename a key that a reader still looks for.

Different writers record different subsets (a simulated run has no loss, a measured one no analytical
estimate), and files written before a key existed must still load. So every field is optional: a key is
written exactly when its writer gave it (``None`` included, which is written as ``null``), a missing key
reads as ``None``, and keys this version does not know are kept in ``extra`` and written back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from slidedp.errors import SlideDPError


class _NotGiven:
    """Default of every summary field: the writer did not record it, so the key is not written."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Any = _NotGiven()


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` reduced to ``cls``'s fields; a field missing from an older file reads as ``None``."""
    return {f.name: data.get(f.name) for f in fields(cls)}


@dataclass(frozen=True)
class SimulatedStep:
    """What the discrete-event simulator predicted for one step (``slidedp simulate``)."""

    step_time_s: float
    tokens_per_s: float
    bottleneck: str
    limiter: str
    compute_s: float
    exposure_s: dict[str, float]


@dataclass(frozen=True)
class AnalyticalStep:
    """What the analytical model estimated for the same step, next to the simulation."""

    step_time_s: float
    lower_bound_s: float
    tokens_per_s: float
    bottleneck: str
    limiter: str
    exposure_s: dict[str, float]


@dataclass(frozen=True)
class MemorySummary:
    """The memory model's estimate for a simulated run, against the budget it was checked under."""

    gpu_peak_gib: float
    gpu_budget_gib: float
    host_total_gib: float
    host_state_bytes_per_param: float


def span_field(attention_span: float | None) -> dict[str, float]:
    """The ``attention_span`` keyword of a summary: given only for packed rows priced by their examples, so
    the summaries of whole-row runs keep their keys."""
    return {} if attention_span is None else {"attention_span": attention_span}


@dataclass(frozen=True)
class RunSummary:
    """Problem, policy, step time, throughput, limiter and memory of one run; the JSON keys are the field names.

    Field order is the order of the keys in the file. See the module docstring for missing and ``None`` values.
    """

    # The problem: model, machine, sequence length and batch.
    model: str | None = _NOT_GIVEN
    model_spec: dict[str, Any] | None = _NOT_GIVEN  # ModelSpec.to_dict(): lets a reader rebuild the exact shape
    hardware: str | None = _NOT_GIVEN
    gpus: int | None = _NOT_GIVEN
    seq: int | None = _NOT_GIVEN
    # Packed rows through the varlen kernel: the examples' token-weighted mean length (slidedp.units.attention_span)
    # that attention was priced at; None: every row one causal sequence.
    attention_span: float | None = _NOT_GIVEN
    adam_threads: int | None = _NOT_GIVEN  # CPU optimizer threads the run used (None: the policy's default)
    batch: int | None = _NOT_GIVEN  # global sequences per optimizer step
    tokens_per_step: int | None = _NOT_GIVEN
    policy: dict[str, Any] | None = _NOT_GIVEN  # Policy.to_dict()
    system: str | None = _NOT_GIVEN  # a peer system's name (slidedp.peers); absent for SlideDP itself
    ranks: int | None = _NOT_GIVEN  # data-parallel ranks of a measured run
    # Where the numbers come from: "simulated" or "measured" (older benchmark files say measured=True instead).
    source: str | None = _NOT_GIVEN
    device: str | None = _NOT_GIVEN
    dtype: str | None = _NOT_GIVEN
    steps: int | None = _NOT_GIVEN
    # The step: simulated for ``slidedp simulate``, the median steady-state step for a measured run.
    step_time_s: float | None = _NOT_GIVEN
    tokens_per_s: float | None = _NOT_GIVEN
    model_tflops_per_gpu: float | None = _NOT_GIVEN
    limiter: str | None = _NOT_GIVEN
    bottleneck: str | None = _NOT_GIVEN
    # slidedp simulate: the simulation and the analytical estimate side by side, and the memory estimate.
    simulated: SimulatedStep | None = _NOT_GIVEN
    analytical: AnalyticalStep | None = _NOT_GIVEN
    memory: MemorySummary | None = _NOT_GIVEN
    # A measured run: its outcome, what it used, and what the simulator predicted for it.
    final_loss: float | None = _NOT_GIVEN
    gpu_peak_gib: float | None = _NOT_GIVEN  # None on a CPU run
    predicted_gpu_peak_gib: float | None = _NOT_GIVEN
    predicted_gpu_allocated_gib: float | None = _NOT_GIVEN  # compare with gpu_peak_gib
    host_rss_peak_gib: float | None = _NOT_GIVEN
    # Every rank's peak RSS and its PSS at the end, by rank: the PSS sum is the group's real host memory (the
    # shared state counted once), where RSS counts it in every rank that maps it.
    host_rss_peak_gib_by_rank: list[float] | None = _NOT_GIVEN
    host_pss_gib_by_rank: list[float] | None = _NOT_GIVEN
    host_state_bytes_per_param: float | None = _NOT_GIVEN
    predicted_step_time_s: float | None = _NOT_GIVEN
    predicted_limiter: str | None = _NOT_GIVEN
    pid: int | None = _NOT_GIVEN
    global_step: int | None = _NOT_GIVEN  # optimizer steps in total, counting those before a resume
    policy_source: str | None = _NOT_GIVEN  # file | default | auto (slidedp train --policy auto: the tuner chose)
    tuner_step_time_s: float | None = _NOT_GIVEN  # --policy auto: the tuner's predicted step time
    data_format: str | None = _NOT_GIVEN  # text | prompt_completion | messages | synthetic
    eval_loss: float | None = _NOT_GIVEN  # mean token loss on the eval data at the end
    eval_perplexity: float | None = _NOT_GIVEN
    measured: bool | None = _NOT_GIVEN  # benchmark-written run directories of measured steps
    # Keys this version does not know (from newer or hand-annotated files), kept so a rewrite loses nothing.
    extra: dict[str, Any] = field(default_factory=dict)
    # Names of the fields the writer gave (or the file held): exactly the keys to_dict() writes.
    given: frozenset[str] = field(init=False, repr=False, compare=False)

    _NESTED: ClassVar[dict[str, type]] = {"simulated": SimulatedStep, "analytical": AnalyticalStep,
                                          "memory": MemorySummary}

    def __post_init__(self) -> None:
        given = []
        for f in self._data_fields():
            if getattr(self, f) is _NOT_GIVEN:
                object.__setattr__(self, f, None)  # readers only ever see None for a missing key
            else:
                given.append(f)
        object.__setattr__(self, "given", frozenset(given))

    @classmethod
    def _data_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("extra", "given")]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self._data_fields():
            if name in self.given:
                value = getattr(self, name)
                out[name] = asdict(value) if name in self._NESTED and value is not None else value
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "summary.json") -> RunSummary:
        """The summary a dict holds; a known key whose value has the wrong JSON type (a step time "abc") is one
        SlideDPError naming ``where``, so that readers never print a placeholder for a value that was there."""
        names = set(cls._data_fields())
        kinds = {f.name: str(f.type) for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in names and value is not None and not _json_type_fits(kinds[key], value):
                kind = kinds[key].split(" |")[0]
                article = "an" if kind[0] in "aeiou" else "a"
                raise SlideDPError(f"malformed {where}: {key} is {value!r:.40}, not {article} {kind}")
            if key in cls._NESTED and isinstance(value, dict):
                values[key] = cls._NESTED[key](**_known(cls._NESTED[key], value))
            elif key in names:
                values[key] = value
        return cls(**values, extra={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str, where: str = "summary.json") -> RunSummary:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SlideDPError(f"malformed {where}: {exc}") from None
        if not isinstance(data, dict):
            raise SlideDPError(f"malformed {where}: expected a JSON object")
        return cls.from_dict(data, where)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> RunSummary:
        return cls.from_json(Path(path).read_text(), where=str(path))

    @property
    def empty(self) -> bool:
        """No summary at all: a bare trace file, or a run directory without summary.json."""
        return not self.given and not self.extra

    def missing(self, *keys: str) -> list[str]:
        """Those of ``keys`` this summary does not hold (given as null counts as held, as a JSON reader sees it)."""
        return [k for k in keys if k not in self.given and k not in self.extra]


def _json_type_fits(annotation: str, value: Any) -> bool:
    """Whether a JSON value suits a summary field annotated ``annotation`` (``float | None``, ``str | None``,
    ``dict[str, Any] | None``, a nested step's class...): a number where a number belongs, and so on; an integer
    where a float belongs, as JSON writes 2.0 as 2."""
    kind = annotation.split(" |")[0].split("[")[0]
    if kind == "bool":
        return isinstance(value, bool)
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return kind == "float" or isinstance(value, int) or value.is_integer()
    expected = {"str": str, "dict": dict, "list": list}.get(kind, dict)  # nested steps are JSON objects
    return isinstance(value, expected)
