"""Syntax rules the API server applies to the objects an LLMDeployment renders, checked first.

The CRD's schema cannot see them all (a CR's own name may be a 253-character DNS
subdomain, but it names a Service, which must be a 63-character DNS-1035 label, and
labels, whose values stop at 63 characters), so ``parse_spec`` and the reconcile check
them here and name the CR's field instead of letting kopf retry a refused create.

Also the shape of the two things a tenant may point the operator at: the Prometheus URL
(fetched from the operator's own network position) and the container image.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass

MAX_LABEL = 63
MAX_HOST = 253  # a DNS name's characters, its dots included
# Every rendered name is the CR's name plus at most this suffix ("-engine", "-rules").
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# resource.Quantity: a decimal number, then a binary-SI, decimal-SI or exponent suffix.
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
INT32_MAX = 2**31 - 1


READ_FROM_SERVICE_LINKS = {
    "KUBERNETES_SERVICE_HOST": "every in-cluster Kubernetes client, as the API server's "
                               "address",
    "KUBERNETES_SERVICE_PORT": "every in-cluster Kubernetes client, as the API server's "
                               "port",
    "VLLM_PORT": "vLLM, as its own internal port (a URI there stops it starting)",
    "VLLM_DP_MASTER_PORT": "vLLM's data-parallel master port",
    "VLLM_EC_SIDE_CHANNEL_PORT": "vLLM's encoder-cache side channel",
    "VLLM_MOONCAKE_BOOTSTRAP_PORT": "vLLM's Mooncake bootstrap port",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "vLLM's NIXL side channel",
    "VLLM_P2P_SIDE_CHANNEL_PORT": "vLLM's P2P side channel",
    "MASTER_PORT": "torch.distributed, as its rendezvous port",
}
"""Variables a Service's links would set (``service_link_variables``) that servers read
as settings of their own, and who reads them: vLLM's ports ending in ``_PORT``
(``envs.py``), torch's rendezvous, the API server's address every client library uses."""


def service_link_variables(name: str) -> set[str]:
    """The variables the kubelet gives each pod of a namespace (service links on, its
    default) for a Service named ``name`` with one TCP port, but for the ``_PORT_<n>_TCP``
    family (no server reads those as a setting)."""
    prefix = name.upper().replace("-", "_")
    return {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}


def deployment_name_problem(name: str) -> str | None:
    """Why ``metadata.name`` cannot name the owned Service and label values, or None."""
    if len(name) > MAX_LABEL:
        return (f"metadata.name={name!r} has {len(name)} characters: it names the "
                f"Service and label values, which allow {MAX_LABEL}; use a shorter name")
    if not DNS_1035.fullmatch(name):
        return (f"metadata.name={name!r}: it names a Service, which needs lowercase "
                "letters, digits and '-', starting with a letter and ending with a letter "
                "or digit (no dots); rename the LLMDeployment, e.g. "
                f"{_suggest(name)!r}")
    if read := sorted(service_link_variables(name) & READ_FROM_SERVICE_LINKS.keys()):
        # The operator's own pods take no links (enableServiceLinks: false), but every
        # other pod of the namespace does, by default.
        return (f"metadata.name={name!r} names a Service whose links give every pod of "
                f"the namespace {read[0]}=<its address>, which "
                f"{READ_FROM_SERVICE_LINKS[read[0]]} reads: rename the LLMDeployment, "
                f"e.g. {name + '-llm'!r}")
    return None


def _suggest(name: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = "llm-" + cleaned
    return cleaned[:MAX_LABEL].rstrip("-")


def quantity_problem(field: str, value: str) -> str | None:
    if m := QUANTITY.fullmatch(value):
        if value.startswith("-") and float(m.group(1)) != 0:
            # The API server refuses a negative request or limit in the Deployment,
            # after the ConfigMap is written, naming the Deployment's field.
            return (f"{field}={value!r} is negative: a request or limit is an amount of "
                    "0 or more; write e.g. '16Gi', '500m' or '4'")
        return None
    hint = ""
    if m := re.fullmatch(r"(\d+(\.\d+)?)([KMGTPE])B", value):
        hint = f" ({m.group(1)}{m.group(3)}i for binary units, {m.group(1)}{m.group(3)} "\
               "for decimal)"
    return (f"{field}={value!r} is not a Kubernetes quantity: write e.g. '16Gi', '500m' "
            f"or '4'{hint}")


def prometheus_url_problem(url: str) -> str | None:
    """Why ``url`` may not be the Prometheus the operator queries, or None.

    http or https, a host, an optional port and path; no user info (credentials would
    ride in status and events), no query and no fragment (the operator appends the API
    path: a query would swallow it, which is how a URL ending in ``?x=`` reached other
    services' endpoints).
    """
    where = f"spec.prometheus.url={url!r}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{where}: {exc}; write e.g. http://prometheus-operated.monitoring:9090"
    if parts.scheme not in ("http", "https"):
        return f"{where}: the scheme must be http or https"
    if not parts.hostname:
        return f"{where}: no host; write e.g. http://prometheus-operated.monitoring:9090"
    if "@" in parts.netloc:
        return f"{where}: user info is not allowed (credentials would show in status)"
    if parts.query or "?" in url:
        return f"{where}: a query string is not allowed; give the server's base URL"
    if parts.fragment or "#" in url:
        return f"{where}: a fragment is not allowed; give the server's base URL"
    if port == 0:
        return f"{where}: port 0 is not a port"
    if any(c.isspace() for c in url):
        return f"{where}: white space is not allowed"
    return _host_problem(where, parts.hostname, bracketed="[" in parts.netloc)


def _host_problem(where: str, host: str, *, bracketed: bool) -> str | None:
    """The URL parsers take any characters for a host, and so matched the allow-list's
    ``*.monitoring`` by the end of ``evil.com\\.monitoring``, which a resolver reading
    ``\\.`` as an escape splits into other labels than the list's. A host is a DNS name
    or an IP address, nothing else."""
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{where}: [{host}] is not an IPv6 address"
        return None
    name = host.lower().removesuffix(".")
    if len(name) > MAX_HOST or not DNS_1123_SUBDOMAIN.fullmatch(name) or any(
            len(label) > MAX_LABEL for label in name.split(".")):
        return (f"{where}: {host!r} is not a host name (dot-separated labels of letters, "
                "digits and '-', each at most 63) nor an IP address")
    return None


@dataclass(frozen=True)
class ImageRef:
    repository: str
    """Normalized: ``docker.io/library/ubuntu`` for ``ubuntu``."""
    reference: str
    """The tag or digest, as written (``:1.0``, ``@sha256:...``), or empty."""


_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*"\
          r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:]+\])(?::\d+)?"
IMAGE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?P<tag>:[\w][\w.-]{0,127})?(?P<digest>@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z]"
    r"[A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$", re.ASCII)  # docker's \w: no unicode letter


def parse_image(image: str, *, prefix: bool = False) -> ImageRef | None:
    """The repository of a container image reference (docker's grammar), or None.

    ``prefix``: ``image`` is the start of repositories (an allow-list's ``docker.io/acme``),
    not one: Docker Hub's implicit ``library/`` is not added.
    """
    if len(image) > 4096:
        return None
    m = IMAGE.fullmatch(image)
    if m is None:
        return None
    domain, path = m.group("domain"), m.group("path")
    # docker's rule: the first component is a registry only with a dot, a port or
    # "localhost"; otherwise the reference is on Docker Hub.
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost"):
        if not re.fullmatch(_COMPONENT, domain):  # then it is a path component after all
            return None
        path, domain = f"{domain}/{path}", None
    if domain is None:
        domain = "docker.io"
        if "/" not in path and not prefix:
            path = f"library/{path}"
    if domain in ("index.docker.io", "registry-1.docker.io"):
        domain = "docker.io"
    return ImageRef(f"{domain.lower()}/{path}", (m.group("tag") or "") + (m.group("digest")
                                                                          or ""))


def image_prefix(stem: str) -> str | None:
    """What the image allow-list entry ``stem/*`` covers: the normalized repository prefix
    (the repositories that start with it and a '/'), or None where ``stem`` is no prefix.

    A registry alone (``ghcr.io``, ``localhost:5000``) by docker's rule, a first component
    with a dot, a port or ``localhost``: read as a path, ``ghcr.io/*`` allowed no image of
    ghcr.io and ``docker.io/ghcr.io/...``, another registry than the one named.
    """
    if "/" not in stem and re.fullmatch(_DOMAIN, stem) and (
            "." in stem or ":" in stem or stem == "localhost"):
        domain = stem.lower()
        return "docker.io" if domain in ("index.docker.io", "registry-1.docker.io") else domain
    ref = parse_image(stem, prefix=True)
    return None if ref is None or ref.reference else ref.repository


MAX_MODEL_REF = 512
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
MODEL_REF_PATTERN = r"^([^-\x00-\x20\x7f][^\x00-\x20\x7f]*)?$"
"""``model_ref_problem``'s rule for the CRD's schema: no leading '-', no whitespace or
control character (RE2 and Python's re read it alike)."""


def model_ref_problem(where: str, value: str | None) -> str | None:
    """The model's name and path become the engine's first argument (vLLM's positional
    model): one that starts with ``-`` would be read as an option a tenant may not set
    (``--trust-remote-code``), and whitespace or control characters are no name."""
    if not value:
        return None
    if value.startswith("-"):
        return (f"{where}={value[:80]!r} starts with '-', which the engine would read as "
                "an option: name the model (e.g. meta-llama/Llama-3.1-8B) or its path")
    if _CONTROL.search(value):
        return (f"{where}={value[:80]!r} holds whitespace or a control character: a model "
                "name or path has none")
    if len(value) > MAX_MODEL_REF:
        return f"{where}: {len(value)} characters; at most {MAX_MODEL_REF}"
    return None
