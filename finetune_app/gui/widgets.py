"""GUI widgets generated from the RunConfig model, and the conversions between widget values and a RunConfig.

Every field of every section gets exactly one widget, chosen from its type annotation (Literal -> dropdown,
bool -> checkbox, int/float -> number with the Field bounds, str -> textbox, lists -> comma-separated textbox,
optional numbers -> textbox where empty means None)
and labelled with its description. Nothing here is re-typed by hand, so a new config field shows up in the GUI
by itself. The spec part is pure Python; gradio is only imported by `make_widget`.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic.fields import FieldInfo

from finetune_app.config import ConfigError, RunConfig, build_config

WidgetKind = Literal["dropdown", "checkbox", "int", "float", "text", "list"]


@dataclass(frozen=True)
class FieldSpec:
    """How one RunConfig field is shown and read back."""

    section: str
    name: str
    kind: WidgetKind
    description: str
    default: Any
    optional: bool = False  # None is a valid value (shown as an empty widget)
    choices: tuple[str, ...] = ()  # dropdown choices, or the literal alternatives of a list field
    minimum: float | None = None
    maximum: float | None = None
    item_type: type = str  # element type of a list field

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def elem_id(self) -> str:
        return f"field-{self.section}-{self.name}"

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")


def _literal_values(annotation: Any) -> tuple[str, ...] | None:
    """All values of a Literal or of a union made only of Literals; None for anything else."""
    if typing.get_origin(annotation) is Literal:
        return tuple(typing.get_args(annotation))
    if _is_union(annotation):
        values: list[str] = []
        for arg in typing.get_args(annotation):
            inner = _literal_values(arg)
            if inner is None:
                return None
            values.extend(inner)
        return tuple(values)
    return None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _bounds(info: FieldInfo) -> tuple[float | None, float | None]:
    # Strict bounds (gt/lt) are shown as inclusive limits; pydantic still rejects the edge value itself.
    low = high = None
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            low = item.ge
        elif isinstance(item, annotated_types.Gt):
            low = item.gt
        elif isinstance(item, annotated_types.Le):
            high = item.le
        elif isinstance(item, annotated_types.Lt):
            high = item.lt
    return low, high


def spec_for(section: str, name: str, info: FieldInfo) -> FieldSpec:
    annotation = info.annotation
    base = dict(section=section, name=name, description=info.description or "", default=info.default)
    literals = _literal_values(annotation)
    if literals is not None:
        return FieldSpec(kind="dropdown", choices=literals, **base)
    args = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    optional = type(None) in args
    rest = [arg for arg in args if arg is not type(None)]
    list_args = [arg for arg in rest if typing.get_origin(arg) is list]
    if list_args:
        item_type = typing.get_args(list_args[0])[0]
        alternatives = tuple(v for arg in rest if arg not in list_args for v in (_literal_values(arg) or ()))
        return FieldSpec(kind="list", optional=optional, choices=alternatives, item_type=item_type, **base)
    if len(rest) != 1:
        raise TypeError(f"no widget for {section}.{name}: unsupported annotation {annotation!r}")
    kind_by_type: dict[Any, WidgetKind] = {bool: "checkbox", int: "int", float: "float", str: "text"}
    kind = kind_by_type.get(rest[0])
    if kind is None:
        raise TypeError(f"no widget for {section}.{name}: unsupported annotation {annotation!r}")
    low, high = _bounds(info) if kind in ("int", "float") else (None, None)
    return FieldSpec(kind=kind, optional=optional, minimum=low, maximum=high, **base)


def field_specs() -> list[FieldSpec]:
    """One spec per RunConfig field, in declaration order (sections, then fields)."""
    return [
        spec_for(section, name, info)
        for section, section_field in RunConfig.model_fields.items()
        for name, info in section_field.annotation.model_fields.items()
    ]


def section_titles() -> dict[str, str]:
    """'lora' -> 'Adapter (PEFT LoRA).' from the section field descriptions."""
    return {name: (info.description or name).rstrip(".") for name, info in RunConfig.model_fields.items()}


# ---------------------------------------------------------------------------------------------
# Values: config -> widget and widget -> config


def to_widget_value(spec: FieldSpec, value: Any) -> Any:
    if spec.kind == "list":
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        return ", ".join(str(item) for item in value)
    if spec.kind == "text" or (spec.optional and spec.kind in ("int", "float")):
        return "" if value is None else str(value)
    return value


def from_widget_value(spec: FieldSpec, raw: Any) -> Any:
    """Turn what a widget holds back into config data. Bad input is passed on so pydantic reports it."""
    if spec.kind in ("text", "list"):
        text = "" if raw is None else str(raw).strip()
        if not text:
            return None if spec.optional else ([] if spec.kind == "list" else "")
        if spec.kind == "text" or text in spec.choices:
            return text
        return [_parse_item(spec.item_type, part.strip()) for part in text.strip("[]").split(",") if part.strip()]
    if spec.kind in ("int", "float"):
        if isinstance(raw, str):
            raw = raw.strip()
            if not raw:
                return None
            try:
                raw = float(raw)
            except ValueError:
                return raw
        if raw is None:
            return None
        if spec.kind == "int" and float(raw).is_integer():
            return int(raw)
        return float(raw)
    return raw


def _parse_item(item_type: type, text: str) -> Any:
    if item_type is int:
        try:
            return int(text)
        except ValueError:
            return text
    return text


def config_to_values(cfg: RunConfig, specs: list[FieldSpec]) -> list[Any]:
    return [to_widget_value(spec, getattr(getattr(cfg, spec.section), spec.name)) for spec in specs]


def values_to_data(specs: list[FieldSpec], values: list[Any]) -> dict[str, dict[str, Any]]:
    """Raw nested config data (as a YAML preset would hold it) from widget values."""
    if len(specs) != len(values):
        raise ValueError(f"expected {len(specs)} widget values, got {len(values)}")
    data: dict[str, dict[str, Any]] = {}
    for spec, raw in zip(specs, values, strict=True):
        data.setdefault(spec.section, {})[spec.name] = from_widget_value(spec, raw)
    return data


def values_to_config(specs: list[FieldSpec], values: list[Any], gpus: list[Any] | None = None) -> RunConfig:
    """Validate widget values into a RunConfig; raises ConfigError with the formatted problems."""
    return build_config(values_to_data(specs, values), source="settings", gpus=gpus)


def try_config(specs: list[FieldSpec], values: list[Any]) -> tuple[RunConfig | None, str]:
    """(config, '') or (None, formatted error text): for handlers that must show errors, not raise."""
    try:
        return values_to_config(specs, values), ""
    except ConfigError as exc:
        return None, str(exc)
    except (TypeError, ValueError) as exc:
        return None, f"settings could not be read: {exc}"


def dependent_updates(load_in: str) -> dict[str, Any]:
    """Fields that only make sense with 4-bit follow the quantization mode, so toggling it never errors."""
    if load_in == "4bit":
        return {"quantization.double_quant": True}
    return {"quantization.double_quant": False, "quantization.quant_type": "nf4"}


def override_args(cfg: RunConfig, base: RunConfig) -> list[str]:
    """`section.field=value` for every field where cfg differs from base (CLI override syntax)."""
    out = []
    for spec in field_specs():
        value = getattr(getattr(cfg, spec.section), spec.name)
        if value != getattr(getattr(base, spec.section), spec.name):
            out.append(f"{spec.key}={_override_text(spec, value)}")
    return out


def _override_text(spec: FieldSpec, value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        if spec.item_type is str:
            return ",".join(value)  # config.apply_overrides splits a bare comma list for list[str] fields
        return "[" + ",".join(str(item) for item in value) + "]"
    if isinstance(value, str) and _needs_yaml_quotes(value):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def _needs_yaml_quotes(text: str) -> bool:
    import yaml

    # Anything YAML would read as something other than this very string (a number, null, a bool) is quoted.
    try:
        return yaml.safe_load(text) != text
    except yaml.YAMLError:
        return True


# ---------------------------------------------------------------------------------------------
# Gradio components (gradio is imported here only)


def make_widget(spec: FieldSpec, value: Any = None):
    import gradio as gr

    value = to_widget_value(spec, spec.default if value is None and not spec.optional else value)
    # Optional numbers are textboxes: a number widget cannot hold "empty" (it sends 0), and empty means default.
    common = dict(label=spec.label, info=f"{spec.description}  [{spec.key}]", elem_id=spec.elem_id)
    if spec.kind == "dropdown":
        return gr.Dropdown(choices=list(spec.choices), value=value, **common)
    if spec.kind == "checkbox":
        return gr.Checkbox(value=bool(value), **common)
    if spec.kind in ("int", "float") and not spec.optional:
        precision = 0 if spec.kind == "int" else None
        step = 1 if spec.kind == "int" else _float_step(spec)
        return gr.Number(
            value=value, minimum=spec.minimum, maximum=spec.maximum, precision=precision, step=step, **common
        )
    placeholder = _placeholder(spec)
    return gr.Textbox(value=value, placeholder=placeholder, max_lines=1, **common)


def _float_step(spec: FieldSpec) -> float:
    # Arrow keys move a fraction at a time; for small defaults (learning rate 2e-4) a tenth of their magnitude.
    if spec.maximum is not None and spec.maximum <= 1:
        return 0.01
    if isinstance(spec.default, float) and 0 < abs(spec.default) < 1:
        return 10 ** math.floor(math.log10(abs(spec.default))) / 10
    return 0.1


def _placeholder(spec: FieldSpec) -> str:
    if spec.kind in ("int", "float"):
        return "empty = not set (a number, e.g. 100)"
    if spec.kind == "list":
        options = " or ".join(spec.choices)
        example = "0, 1" if spec.item_type is int else "q_proj, v_proj"
        return f"comma-separated, e.g. {example}" + (f" (or {options})" if options else "")
    return "(empty = default)" if spec.optional else ""
