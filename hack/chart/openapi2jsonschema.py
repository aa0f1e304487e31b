#!/usr/bin/env python3
"""Turn Kubernetes OpenAPI into the standalone JSON schemas kubeconform reads offline.

  openapi2jsonschema.py k8s SWAGGER.json --out DIR --version v1.33.13
      DIR/v1.33.13-standalone-strict/<kind>-<groupprefix>-<version>.json (and -standalone/):
      kubeconform's default layout, `-schema-location DIR -kubernetes-version 1.33.13`.
  openapi2jsonschema.py crd --out DIR CRD.yaml...
      DIR/<group>/<kind>_<version>.json from each served version's openAPIV3Schema:
      `-schema-location 'DIR/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'`.

kubeconform compiles a schema as JSON Schema draft 4 and treats one that fails to load as
missing, so the output must be self-contained draft 4: every $ref is inlined, except for
definitions that reach themselves (JSONSchemaProps), which stay in the file's own
"definitions". "Strict" closes every object that lists its properties
(additionalProperties: false) so an unknown or misspelt key is an error, as `kubectl apply
--validate=strict` would say. Descriptions are dropped: kubeconform never shows them and
they would make the inlined files several times larger.
"""

import argparse
import copy
import json
import os
import re
import sys

DRAFT4 = "http://json-schema.org/draft-04/schema#"

# resource.Quantity as the API server parses it: signed decimal number with an optional binary
# (Ki..Ei), decimal (n u m k M G T P E) or exponent suffix; YAML may also give a bare number.
QUANTITY = {
    "anyOf": [
        {"type": "string",
         "pattern": r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"},
        {"type": "number"},
    ]
}
INT_OR_STRING = {"anyOf": [{"type": "string"}, {"type": "integer"}]}
# Definitions replaced by what their YAML may actually hold (swagger only says "string").
SPECIAL = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY,
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": INT_OR_STRING,
}

# Keywords whose value is one schema / a list of schemas / a map of name -> schema.
SUB_ONE = ("items", "additionalProperties", "not", "additionalItems")
SUB_LIST = ("allOf", "anyOf", "oneOf")
SUB_MAP = ("properties", "patternProperties", "definitions")
DROP = ("description", "example", "externalDocs")


def strip(schema):
    """A copy without descriptions and x-kubernetes-* annotations (recursing into subschemas)."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in DROP or key.startswith("x-"):
            continue
        if key in SUB_ONE:
            out[key] = strip(value) if isinstance(value, dict) else (
                [strip(v) for v in value] if isinstance(value, list) else value)
        elif key in SUB_LIST:
            out[key] = [strip(v) for v in value]
        elif key in SUB_MAP:
            out[key] = {name: strip(v) for name, v in value.items()}
        else:
            out[key] = copy.deepcopy(value)
    return out


def allow_null(schema):
    """Accept null too: the API server treats an explicit null optional field as absent."""
    s = dict(schema)
    t = s.get("type")
    if isinstance(t, str):
        s["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        s["type"] = t + ["null"]
    elif t is None:
        for key in ("anyOf", "oneOf"):
            if key in s:
                s[key] = s[key] + [{"type": "null"}]
                break
        else:
            return s  # no type, no alternatives: accepts anything already
    if "enum" in s and None not in s["enum"]:
        s["enum"] = s["enum"] + [None]
    return s


def close(schema, strict):
    """Recursively: optional properties may be null; strict closes objects with properties."""
    if not isinstance(schema, dict):
        return schema
    s = dict(schema)
    for key in SUB_ONE:
        if isinstance(s.get(key), dict):
            s[key] = close(s[key], strict)
        elif isinstance(s.get(key), list):
            s[key] = [close(v, strict) for v in s[key]]
    for key in SUB_LIST:
        if key in s:
            s[key] = [close(v, strict) for v in s[key]]
    if "definitions" in s:
        s["definitions"] = {n: close(v, strict) for n, v in s["definitions"].items()}
    if "properties" in s:
        required = set(s.get("required", []))
        s["properties"] = {
            name: close(v, strict) if name in required else allow_null(close(v, strict))
            for name, v in s["properties"].items()}
        if strict and "additionalProperties" not in s:
            s["additionalProperties"] = False
    return s


# ---------------------------------------------------------------- Kubernetes (swagger 2.0)

def ref_name(ref):
    prefix = "#/definitions/"
    if not ref.startswith(prefix):
        raise ValueError(f"unsupported $ref {ref!r}")
    return ref[len(prefix):]


def subschemas(schema):
    """The schemas directly inside schema (property names are never keywords)."""
    for key in SUB_ONE:
        if isinstance(schema.get(key), dict):
            yield schema[key]
        elif isinstance(schema.get(key), list):
            yield from schema[key]
    for key in SUB_LIST:
        yield from schema.get(key, [])
    for key in SUB_MAP:
        yield from schema.get(key, {}).values()


def refs_in(schema, acc):
    if isinstance(schema, dict):
        if "$ref" in schema:
            acc.add(ref_name(schema["$ref"]))
        for sub in subschemas(schema):
            refs_in(sub, acc)
    return acc


def cyclic_definitions(defs):
    """Names of definitions that can reach themselves through $refs (cannot be inlined)."""
    graph = {name: refs_in(d, set()) & defs.keys() for name, d in defs.items()}
    cyclic = set()
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            n = todo.pop()
            if n == start:
                cyclic.add(start)
                break
            if n not in seen:
                seen.add(n)
                todo.extend(graph[n])
    return cyclic


class Inliner:
    def __init__(self, defs):
        self.defs = {name: SPECIAL.get(name) or strip(d) for name, d in defs.items()}
        self.cyclic = cyclic_definitions(self.defs)
        self.memo = {}

    def expand(self, schema, used):
        """schema with every $ref replaced by its definition; cyclic ones become local refs
        (their names collected in `used`)."""
        if isinstance(schema, list):
            return [self.expand(v, used) for v in schema]
        if not isinstance(schema, dict):
            return schema
        if "$ref" in schema:
            # swagger puts a description next to $ref; draft 4 ignores siblings of $ref anyway.
            name = ref_name(schema["$ref"])
            if name in self.cyclic:
                used.add(name)
                return {"$ref": "#/definitions/" + name}
            if name not in self.memo:
                inner = set()
                self.memo[name] = (self.expand(self.defs[name], inner), inner)
            expanded, inner = self.memo[name]
            used |= inner
            return expanded
        out = {}
        for key, value in schema.items():
            if key in SUB_MAP:
                out[key] = {n: self.expand(v, used) for n, v in value.items()}
            elif key in SUB_ONE or key in SUB_LIST:
                out[key] = self.expand(value, used)
            else:
                out[key] = value
        return out

    def standalone(self, name):
        used = set()
        root = self.expand(self.defs[name], used)
        local, todo = {}, list(used)
        while todo:  # the cyclic definitions this one reaches, and theirs
            n = todo.pop()
            if n in local:
                continue
            more = set()
            local[n] = self.expand(self.defs[n], more)
            todo.extend(more - local.keys())
        root = dict(root)
        if local:
            root["definitions"] = local
        return root


def kind_file(kind, group, version):
    # kubeconform: lowercased kind, "-" + the group's first label (none for the core group),
    # "-" + version.
    prefix = group.split(".")[0] + "-" if group else ""
    return f"{kind.lower()}-{prefix}{version}.json"


def write_json(path, schema):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(schema, f, separators=(",", ":"), sort_keys=True)
    os.replace(tmp, path)


def convert_k8s(swagger_path, out, version):
    with open(swagger_path) as f:
        defs = json.load(f)["definitions"]
    inliner = Inliner(defs)
    # Several definitions can claim one kind (meta/v1 WatchEvent, DeleteOptions are listed
    # under every group); the one whose name ends in the kind is the real one.
    chosen = {}
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            fname = kind_file(gvk["kind"], gvk.get("group", ""), gvk["version"])
            own = name.rsplit(".", 1)[-1] == gvk["kind"]
            if fname not in chosen or (own and not chosen[fname][1]):
                chosen[fname] = (name, own)
    counts = {}
    for strict, suffix in ((True, "-strict"), (False, "")):
        d = os.path.join(out, f"{version}-standalone{suffix}")
        os.makedirs(d, exist_ok=True)
        for fname, (name, _) in sorted(chosen.items()):
            schema = close(inliner.standalone(name), strict)
            schema["$schema"] = DRAFT4
            write_json(os.path.join(d, fname), schema)
        counts[d] = len(chosen)
    for d, n in counts.items():
        print(f"openapi2jsonschema: {n} schemas in {d}")


# ---------------------------------------------------------------- CRDs (OpenAPI v3 subset)

def crd_schema(schema, root=False):
    """A CRD structural schema as strict draft 4: int-or-string, nullable, preserve-unknown
    and embedded resources spelt out, objects with properties closed."""
    if not isinstance(schema, dict):
        return schema
    s = {}
    for key, value in schema.items():
        if key in DROP or key.startswith("x-") or key == "nullable":
            continue
        if key in SUB_MAP:
            s[key] = {n: crd_schema(v) for n, v in value.items()}
        elif key in SUB_LIST:
            s[key] = [crd_schema(v) for v in value]
        elif key in SUB_ONE:
            s[key] = crd_schema(value) if isinstance(value, dict) else value
        else:
            s[key] = copy.deepcopy(value)
    if schema.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        # controller-gen already writes anyOf [integer, string]; the bare marker means the same
        if "anyOf" not in s and "oneOf" not in s:
            s["anyOf"] = copy.deepcopy(INT_OR_STRING["anyOf"])
    if schema.get("x-kubernetes-embedded-resource") or root:
        props = s.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    if schema.get("nullable"):
        s = allow_null(s)
    if "properties" in s and "additionalProperties" not in s \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        s["additionalProperties"] = False
    return s


def convert_crds(paths, out):
    import yaml  # only this mode needs PyYAML

    n = 0
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            group, kind = spec["group"], spec["names"]["kind"]
            for v in spec["versions"]:
                if not v.get("served", True):
                    continue
                raw = (v.get("schema") or {}).get("openAPIV3Schema")
                if raw is None:
                    sys.exit(f"openapi2jsonschema: {path}: {kind} {v['name']} has no openAPIV3Schema")
                schema = crd_schema(raw, root=True)
                schema["$schema"] = DRAFT4
                d = os.path.join(out, group)
                os.makedirs(d, exist_ok=True)
                write_json(os.path.join(d, f"{kind.lower()}_{v['name']}.json"), schema)
                n += 1
    print(f"openapi2jsonschema: {n} CRD schemas in {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    k = sub.add_parser("k8s", help="Kubernetes swagger.json -> kubeconform standalone schemas")
    k.add_argument("swagger")
    k.add_argument("--out", required=True)
    k.add_argument("--version", required=True, help="e.g. v1.33.13 (directory name prefix)")
    c = sub.add_parser("crd", help="CustomResourceDefinition YAML -> {group}/{kind}_{version}.json")
    c.add_argument("crds", nargs="+")
    c.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.mode == "k8s":
        if not re.fullmatch(r"v\d+\.\d+\.\d+", args.version):
            ap.error("--version looks like v1.33.13")
        convert_k8s(args.swagger, args.out, args.version)
    else:
        convert_crds(args.crds, args.out)


if __name__ == "__main__":
    main()
