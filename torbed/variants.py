"""Relay variants: scheduler designs, each a tor build (patches) plus a torrc fragment.

A variant family lives in ``images/relay/variants/<family>/variant.yaml``; families with
parameters are instantiated by name:

- ``<family>``: every parameter at its default;
- ``<family>-<number>``: the first parameter set, e.g. ``ewma-66`` = halflife 66;
- ``<family>-<preset>``: a named set of several parameters from the family's ``presets:``,
  e.g. ``torchestra-exp1`` = T_h 1.4 and B 0.18 (Gopal & Heninger's experiment 1). A preset
  lives beside the parameters it sets, with the paper's line it comes from, so a scenario
  names it in one token that is also a valid file, label and ConfigMap key.

Whatever the name, ``Variant.parameters`` holds every parameter's value, and
``describe(name)`` is the record a run keeps of it (meta.json ``variant_specs``).

Public API:

- ``load_variant(name, variants_dir=VARIANTS_DIR) -> Variant``  (raises ``VariantError``)
- ``list_families(variants_dir) -> list[str]``
- ``describe(name, variants_dir) -> dict`` name, family, preset and every parameter's value
- ``presets(family, variants_dir) -> dict`` the family's presets, {preset: {parameter: value}}
- ``Variant.build_key`` content hash of what the binary is built from; config-only variants
  share the key of the unpatched ("stock") build, so they differ from patched variants only
  by their patches, never by build flags.
- ``stock_build_key()`` the key of the unpatched build (authorities and clients use it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import constants
from .errors import InputError


class VariantError(InputError, ValueError):
    """A variant name does not resolve or its variant.yaml is malformed."""


@dataclass(frozen=True)
class Variant:
    name: str
    family: str
    description: str
    paper: str
    tor_version: str
    patches: tuple[Path, ...]
    torrc: str
    parameters: dict = field(default_factory=dict)
    directory: Path | None = None
    # Environment of this variant's relays over torenv.tor_env(): {variable: value}, an
    # empty value unsets the variable (e.g. mtrelay's MALLOC_ARENA_MAX).
    env: dict = field(default_factory=dict)
    # The preset the name selected (``torchestra-exp1`` -> "exp1"), else None.
    preset: str | None = None
    # Every option of the family applies at run time (SETCONF): a crossover arm (torbed/crossover.py).
    runtime_switch: bool = False

    @property
    def build_key(self) -> str:
        return build_key(self.tor_version, self.patches)


_ALLOWED_KEYS = {"name", "description", "paper", "tor", "patches", "torrc", "parameters", "presets", "env",
                 "runtime_switch"}
PRESET_NAME = r"[a-z][a-z0-9_]{0,31}"


def build_key(tor_version: str, patches: tuple[Path, ...] | list[Path] = ()) -> str:
    """Hash of the tor version, the build script and each patch's content."""
    h = hashlib.sha256()
    h.update(tor_version.encode())
    if constants.BUILD_SCRIPT.exists():
        h.update(constants.BUILD_SCRIPT.read_bytes())
    for p in patches:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return f"{tor_version}-{h.hexdigest()[:16]}"


def stock_build_key() -> str:
    return build_key(constants.TOR_VERSION, ())


def list_families(variants_dir: Path = constants.VARIANTS_DIR) -> list[str]:
    return sorted(p.parent.name for p in variants_dir.glob("*/variant.yaml"))


def _read_family(family: str, variants_dir: Path) -> dict:
    path = variants_dir / family / "variant.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise VariantError(f"{path}: cannot read: {e}") from e
    if not isinstance(data, dict):
        raise VariantError(f"{path}: expected a mapping")
    unknown = set(data) - _ALLOWED_KEYS
    if unknown:
        raise VariantError(f"{path}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_ALLOWED_KEYS)})")
    for key in ("name", "description", "tor", "torrc"):
        if key not in data:
            raise VariantError(f"{path}: missing key '{key}'")
    if data["name"] != family:
        raise VariantError(f"{path}: name '{data['name']}' must equal its folder name '{family}'")
    return data


def load_variant(name: str, variants_dir: Path = constants.VARIANTS_DIR) -> Variant:
    """Resolve a variant name ('kist', 'ewma-66') to a Variant with its torrc rendered."""
    families = list_families(variants_dir)
    family, _, arg = name.partition("-")
    if name in families:
        family, arg = name, ""
    if family not in families:
        raise VariantError(
            f"unknown variant '{name}' (known: {', '.join(families) or 'none'}; "
            f"parametrised families take a value, e.g. ewma-66)")
    data = _read_family(family, variants_dir)
    path = variants_dir / family / "variant.yaml"
    params_spec = data.get("parameters") or {}
    presets = _presets(data, path)
    values: dict[str, float | int] = {pname: spec.get("default") for pname, spec in params_spec.items()}
    preset = None
    if arg and not params_spec:
        raise VariantError(f"variant '{family}' takes no parameter, got '{name}'")
    if arg in presets:
        preset = arg
        values.update(presets[arg])
    elif arg:
        pname = next(iter(params_spec))
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", arg):
            known = f"; presets: {', '.join(sorted(presets))}" if presets else ""
            raise VariantError(f"variant '{name}': '{arg}' is not a number for parameter '{pname}' "
                               f"and not a preset of '{family}'{known}")
        values[pname] = _checked(f"variant '{name}'", pname, float(arg), params_spec[pname])
    try:
        torrc = data["torrc"].format(**values)
    except (KeyError, IndexError) as e:
        raise VariantError(f"{path}: torrc uses undefined parameter {e}") from e
    env_spec = data.get("env") or {}
    if not isinstance(env_spec, dict) or not all(isinstance(k, str) and re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)
                                                  for k in env_spec):
        raise VariantError(f"{path}: env must map environment variable names to values")
    try:
        env = {k: str("" if v is None else v).format(**values) for k, v in env_spec.items()}
    except (KeyError, IndexError) as e:
        raise VariantError(f"{path}: env uses undefined parameter {e}") from e
    patches = tuple(variants_dir / family / p for p in (data.get("patches") or []))
    for p in patches:
        if not p.exists():
            raise VariantError(f"{path}: patch '{p.name}' listed but missing")
    canonical = family if not arg else f"{family}-{arg}"
    return Variant(name=canonical, family=family, description=data["description"],
                   paper=data.get("paper", ""), tor_version=str(data["tor"]), patches=patches,
                   torrc=torrc, parameters=values, directory=variants_dir / family, env=env, preset=preset,
                   runtime_switch=bool(data.get("runtime_switch")))


def _checked(where: str, pname: str, v: float, spec: dict) -> float | int:
    lo, hi = spec.get("min"), spec.get("max")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise VariantError(f"{where}: {pname}={v:g} outside [{lo}, {hi}]")
    return int(v) if v.is_integer() else v


def _presets(data: dict, path: Path) -> dict[str, dict[str, float | int]]:
    """The family's ``presets:`` checked: {preset: {parameter: value}}, each value in its range."""
    raw = data.get("presets") or {}
    spec = data.get("parameters") or {}
    if not isinstance(raw, dict):
        raise VariantError(f"{path}: presets must map a preset name to {{parameter: value}}")
    out = {}
    for pname, values in raw.items():
        where = f"{path}: presets.{pname}"
        if not isinstance(pname, str) or not re.fullmatch(PRESET_NAME, pname):
            raise VariantError(f"{where}: a preset name is lower case letters, digits and _ "
                               f"({PRESET_NAME}), starting with a letter")
        if not isinstance(values, dict) or not values:
            raise VariantError(f"{where}: expected a non-empty mapping of parameter: value")
        out[pname] = {}
        for k, v in values.items():
            if k not in spec:
                raise VariantError(f"{where}.{k}: not a parameter of '{data['name']}' (parameters: {', '.join(spec)})")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise VariantError(f"{where}.{k}: {v!r} is not a number")
            out[pname][k] = _checked(f"{where}", k, float(v), spec[k])
    return out


def presets(family: str, variants_dir: Path = constants.VARIANTS_DIR) -> dict[str, dict[str, float | int]]:
    """The family's presets, checked: {preset: {parameter: value}} (raises VariantError)."""
    return _presets(_read_family(family, variants_dir), variants_dir / family / "variant.yaml")


def describe(name: str, variants_dir: Path = constants.VARIANTS_DIR) -> dict:
    """What a run records of a variant: its name, family, preset and every parameter's value."""
    v = load_variant(name, variants_dir)
    return {"name": v.name, "family": v.family, "preset": v.preset, "parameters": dict(v.parameters)}
