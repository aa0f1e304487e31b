"""Get the built images onto a cluster's nodes: ``torbed images load --to TARGET``.

No torbed image is published, so the chart's references (``torbed/client:0.1.0``, ...) resolve
to Docker Hub unless the images are already in each node's container runtime or in a
registry the chart is pointed at. Each kind of cluster has its own way in; this module builds
that setup's own command line and runs it:

    local     hack/cluster/cluster.sh load-image REF...    (the project's cluster, tests/e2e)
    kind      kind load docker-image REF... --name CLUSTER
    k3s       docker save REF... | k3s ctr images import -  (run on each k3s node, as root)
    minikube  minikube image load REF -p PROFILE          (one call per image)
    registry  docker push REGISTRY/torbed/...  + manifest list (registry.py, make images-push);
              then install with --set images.registry=REGISTRY

The images are those ``make images`` built for this machine's architecture (images.plan), under
the chart's default references and their content tags. ``--dry-run`` prints the command lines
without running them.

Public API: ``TARGETS``, ``Step``, ``refs(kinds, families) -> list[str]``,
``steps(target, refs, cluster=None) -> list[Step]``, ``load(target, ...) -> list[Step]``,
``cmd_images(args) -> int`` (the CLI).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ... import images, resources
from ...errors import InputError, RunFailed

TARGETS = ("local", "kind", "k3s", "minikube", "registry")
# The cluster (kind) or profile (minikube) each tool uses when none is named.
DEFAULT_CLUSTER = {"kind": "kind", "minikube": "minikube"}


class LoadError(RunFailed):
    """A load command failed or its tool is missing (exit code 1)."""


@dataclass(frozen=True)
class Step:
    """One command, or two joined by a pipe (``feed | argv``)."""
    argv: tuple[str, ...]
    feed: tuple[str, ...] | None = None

    def shell(self) -> str:
        import shlex
        line = shlex.join(self.argv)
        return f"{shlex.join(self.feed)} | {line}" if self.feed else line


def refs(kinds: list[str] | tuple[str, ...] = images.DEFAULT_IMAGES, families: list[str] | None = None) -> list[str]:
    """The local tags of the images to load (this machine's architecture): each under the
    chart's default tag and under its content tag (what `torbed run --backend k8s` installs
    with, backend.content_tags). Both name one image: loading the second costs nothing."""
    plan = images.plan(None, kinds, families)
    return [i.tag for i in plan] + [images.content_tag(i) for i in plan]


def steps(target: str, refs: list[str], cluster: str | None = None) -> list[Step]:
    """The command lines that load ``refs`` into ``target`` (not for ``registry``: registry.py pushes)."""
    if not refs:
        raise InputError("no images to load")
    if target == "local":
        # hack/ is in a checkout only (not shipped): the local cluster is a developer's.
        return [Step((str(resources.ROOT / "hack" / "cluster" / "cluster.sh"), "load-image", *refs))]
    if target == "kind":
        return [Step(("kind", "load", "docker-image", *refs, "--name", cluster or DEFAULT_CLUSTER["kind"]))]
    if target == "k3s":
        if cluster:
            raise InputError("--cluster: k3s imports into the node it runs on; run this on each node instead")
        return [Step(("k3s", "ctr", "images", "import", "-"), feed=("docker", "save", *refs))]
    if target == "minikube":
        return [Step(("minikube", "image", "load", ref, "-p", cluster or DEFAULT_CLUSTER["minikube"])) for ref in refs]
    raise InputError(f"--to: '{target}' is not one of {', '.join(TARGETS)}")


def _check_built(docker: str, refs: list[str]) -> None:
    missing = [r for r in refs if subprocess.run([docker, "image", "inspect", r], capture_output=True).returncode != 0]
    if missing:
        raise LoadError(f"not built: {', '.join(missing)}; run `make images` first")


def run(step: Step, say=print) -> None:
    for tool in ((step.feed[0],) if step.feed else ()) + (step.argv[0],):
        if shutil.which(tool) is None:
            raise LoadError(f"{tool}: not found on PATH; install it, or run this where it is (the command: {step.shell()})")
    say(f"$ {step.shell()}")
    if step.feed:
        feed = subprocess.Popen(step.feed, stdout=subprocess.PIPE)
        p = subprocess.run(step.argv, stdin=feed.stdout, capture_output=True, text=True)
        feed.stdout.close()
        fed = feed.wait()
    else:
        p, fed = subprocess.run(step.argv, capture_output=True, text=True), 0
    # The importer first: when it dies, the feeder only sees a broken pipe.
    if p.returncode != 0:
        raise LoadError(f"{step.shell()}: {step.argv[0]} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    if fed != 0:
        raise LoadError(f"{step.shell()}: {step.feed[0]} exited {fed}")


def load(target: str, kinds=images.DEFAULT_IMAGES, families: list[str] | None = None, cluster: str | None = None,
         registry: str | None = None, dry_run: bool = False, say=print) -> list[Step]:
    """Load (or with dry_run only list) the images into ``target``; returns the steps."""
    if target == "registry":
        if not registry:
            raise InputError("--to registry needs --registry HOST[:PORT]")
        if dry_run:
            say(f"would push {', '.join(refs(kinds, families))} to {registry} (python -m torbed.backends.k8s.registry)")
            return []
        from . import registry as reg
        reg.publish_images(registry, list(kinds), families, insecure=registry.startswith(("127.0.0.1", "localhost")),
                           say=say)
        say(f"install with --set images.registry={registry}")
        return []
    if registry:
        raise InputError(f"--registry is only for --to registry, not --to {target}")
    todo = steps(target, refs(kinds, families), cluster)
    if dry_run:
        for s in todo:
            say(s.shell())
        return todo
    _check_built(images.ensure_engine(), refs(kinds, families))
    for s in todo:
        run(s, say)
    return todo


def add_parser(sub, fmt) -> None:
    p = sub.add_parser("images", help="get the built images onto a cluster's nodes (kind, k3s, minikube, a registry)",
                       formatter_class=fmt, description=__doc__.split("\n\n")[0])
    isub = p.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    lp = isub.add_parser("load", help="load the images `make images` built into a cluster, or push them to a registry",
                         formatter_class=fmt)
    lp.add_argument("--to", required=True, choices=TARGETS,
                    help="local: the project's cluster (hack/cluster/cluster.sh); kind: kind load docker-image; k3s: docker save | "
                         "k3s ctr images import - (on the node); minikube: minikube image load; registry: docker push")
    lp.add_argument("--cluster", default=None, help="kind cluster name (default kind) or minikube profile (default minikube)")
    lp.add_argument("--registry", default=None, help="--to registry: HOST[:PORT] to push to")
    lp.add_argument("--images", default=",".join(images.DEFAULT_IMAGES), help="comma-separated image kinds")
    lp.add_argument("--variants", default=None, help="comma-separated relay families (default: all)")
    lp.add_argument("--dry-run", action="store_true", help="print the command lines only")
    lp.set_defaults(func=cmd_images)


def cmd_images(args) -> int:
    import sys
    from ...errors import EXIT_FAILED, EXIT_OK
    kinds = [k for k in args.images.split(",") if k]
    bad = [k for k in kinds if k not in images.IMAGES]
    try:
        if bad:
            raise InputError(f"--images: {', '.join(bad)} not one of {', '.join(images.IMAGES)}")
        load(args.to, kinds, args.variants.split(",") if args.variants else None, args.cluster, args.registry,
             args.dry_run)
    except InputError as e:
        print(f"torbed images load: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"torbed images load: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
