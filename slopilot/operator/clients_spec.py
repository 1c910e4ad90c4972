"""``spec.clients``: the priority classes each API key may name, for the built-in engine.

    clients:
      keys:
      - {name: checkout, sha256: <printf %s KEY | sha256sum>, maxClass: p0}
      - {name: reports, sha256: ..., maxClass: p1, defaultClass: p2}
      anonymous: {maxClass: p2}   # requests without a granted key; absent: refused (401)

The engine's own parser (``slopilot.engine.clients``) judges it, so the operator and
``slopilot serve --clients`` cannot disagree on what a grant means; the schema here is as
tight as that parser, so the API server refuses most bad grants before the operator sees
them. The one rule it leaves to the parser is two keys of one digest: CEL comparing every
pair of 1024 keys is past what the API server lets a rule cost (a rule on each key alone,
such as the empty key's digest, is not).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from slopilot.engine.clients import MAX_KEYS, ClientClasses, ClientsError
from slopilot.engine.request import Priority
from slopilot.operator.crd_types import obj, string

CLASSES = [p.label for p in Priority]
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
# The parser's own rules (clients.py): a DNS-1123 label, the digest as hex.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DIGEST_PATTERN = r"^[0-9a-fA-F]{64}$"
NO_GRANT = ("no keys and no anonymous grant would refuse every request: add keys, or "
            "anonymous: {maxClass: p2}, or remove spec.clients")
VLLM_REFUSAL = (
    "spec.clients: the grants are the built-in engine's, which checks each request's key "
    "and class; vLLM's --api-key admits every key or none and its meter judges every "
    "request in one class (spec.slo.vllmClass): remove spec.clients or use backend: builtin")
VLLM_RULE = "!has(self.clients) || !has(self.backend) || self.backend == 'builtin'"
_DEFAULT_RULE = {"rule": "!has(self.defaultClass) || self.defaultClass >= self.maxClass",
                 "message": "defaultClass must not be more urgent than maxClass"}


def _grant_fields() -> dict[str, Any]:
    # maxLength: the API server prices a CEL rule by the longest string it may compare,
    # times 1024 keys; the enum alone does not bound it. Fresh lists: one object shared
    # would be a YAML anchor in manifests/crd.yaml.
    return {
        "maxClass": string("The most urgent class the client may name: this one and every "
                           "less urgent one (p0 realtime, p1 standard, p2 batch).",
                           enum=list(CLASSES), maxLength=2),
        "defaultClass": string("The class of the client's requests that name none; not "
                               "more urgent than maxClass. Default: p1, or maxClass where "
                               "that is less urgent.", enum=list(CLASSES), maxLength=2),
    }


def clients_schema() -> dict[str, Any]:
    """``spec.clients``' OpenAPI schema (``crd.py``)."""
    key = obj({
        "name": string("Names the client in the engine's refusals and logs: lower-case "
                       "letters, digits and '-', 1 to 63 characters, not 'anonymous'.",
                       pattern=NAME_PATTERN, maxLength=63),
        "sha256": string("The SHA-256 digest of the client's API key, 64 hex digits "
                         "(`printf %s KEY | sha256sum`): never the key.",
                         pattern=DIGEST_PATTERN, maxLength=64),
        **_grant_fields(),
    }, required=["name", "sha256", "maxClass"])
    key["x-kubernetes-validations"] = [
        dict(_DEFAULT_RULE), {"rule": "self.name != 'anonymous'",
                        "message": "'anonymous' names requests without a key; pick another "
                                   "name"},
        # The parser's refusal of the empty key's digest (a KEY unset when digested), in
        # any case of its hex digits; one regex per key, not a comparison of pairs.
        {"rule": f"!self.sha256.matches('(?i)^{EMPTY_DIGEST}$')",
         "message": "sha256 is the SHA-256 of an empty key (was KEY unset in `printf %s KEY "
                    "| sha256sum`?); digest the key itself"}]
    anonymous = obj(_grant_fields(), required=["maxClass"],
                    desc="The grant of requests that present no granted key (or none at "
                         "all); absent: they are refused (401).")
    anonymous["x-kubernetes-validations"] = [dict(_DEFAULT_RULE)]
    keys = {"type": "array", "maxItems": MAX_KEYS, "items": key,
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "description": "The API keys granted classes, each held as its SHA-256 digest, "
                           "never the key: the grants sit in a ConfigMap that whoever reads "
                           "the deployment may read, and a digest of a random key (128 bits "
                           "or more) lets nobody present it. A guessable key's digest can be "
                           f"searched. At most {MAX_KEYS}."}
    clients = obj({"keys": keys, "anonymous": anonymous}, desc=(
        "Which priority classes each client may name (backend builtin only). A request "
        "naming a class above its key's grant is refused (403); absent, any request may "
        "name any class, P0 included. An edit of the grants reaches the running engines "
        "without a restart (they re-read the file); adding or removing spec.clients rolls "
        "the pods."))
    clients["x-kubernetes-validations"] = [{
        "rule": "has(self.anonymous) || (has(self.keys) && size(self.keys) > 0)",
        "message": NO_GRANT}]
    return clients


def parse_clients(spec: Mapping[str, Any], builtin: bool,
                  problems: list[str]) -> ClientClasses | None:
    """``spec.clients`` by the engine's parser; None where absent (anyone names any class)
    or refused (a problem appended, naming the field and the fix)."""
    raw = spec.get("clients")
    if raw is None:
        return None
    if not builtin:
        problems.append(VLLM_REFUSAL)
        return None
    try:
        return ClientClasses.from_dict(raw)
    except ClientsError as exc:
        problems.append(f"spec.{exc.field}: {exc.detail}")
        return None
