"""The test bed's command line.

    python -m testbed build          build the pinned binaries and the images (once)
    python -m testbed build --cluster
                                     only what the cluster needs without KEDA (no Flux and no
                                     checkers): `make test` builds the rest beside the e2e
                                     suite's first modules, which need none of it
    python -m testbed up             start the cluster and register the fake nodes
    python -m testbed status         show what runs and where the kubeconfig is
    python -m testbed down           stop the cluster and remove its state
    python -m testbed kubeconfig     print the kubeconfig's path
    python -m testbed images build   build the images that are missing (progress shown)
    python -m testbed images build --torch
                                     the torch images too, which the suites that run on them
                                     otherwise build when they start: `make test` builds them
                                     beside the e2e suite's first modules
    python -m testbed images list    the image references and whether each is built
    python -m testbed images stream REF [DIFF_ID ...]
                                     write an image in the builder's store to standard output
                                     as an OCI layout in a tar, without the layers named (those
                                     containerd has unpacked)

Only the standard library is used, so this works before the virtual environment exists.
"""

from __future__ import annotations

import argparse
import sys

import toolchain
from testbed import cluster, images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build")
    build.add_argument("--cluster", action="store_true", help="the cluster alone, without KEDA")
    for name in ("up", "down", "status", "kubeconfig"):
        commands.add_parser(name)
    image = commands.add_parser("images", help="the project's images alone")
    image.add_argument("action", choices=["build", "list", "stream"])
    image.add_argument("reference", nargs="?", help="stream: the image")
    image.add_argument("have", nargs="*", help="stream: the diff IDs of the layers to leave out")
    image.add_argument(
        "--torch",
        action="store_true",
        help="build: the torch images too (else built when a suite asks for them)",
    )
    args = parser.parse_args(argv)
    if args.command == "build" and args.cluster:
        cluster.build_all(toolchain.CLUSTER_TOOLS, scaling=False)
    elif args.command == "build":
        cluster.build_all()
    elif args.command == "up":
        cluster.up()
    elif args.command == "down":
        cluster.down()
    elif args.command == "kubeconfig":
        print(cluster.KUBECONFIG)
    elif args.command == "images" and args.action == "stream":
        if not args.reference:
            parser.error("images stream: give the image's reference")
        images.stream(args.reference, set(args.have), sys.stdout.buffer)
    elif args.command == "images":
        if args.action == "build":
            images.build()
            # One at a time: a suite waiting for the first need not wait for the second.
            for torch_image in images.ON_DEMAND if args.torch else ():
                images.build((torch_image,))
        for i in (*images.ALL, *images.ON_DEMAND):
            print(f"{i.name:19} {'built' if images.built(i) else 'missing':8} {images.ref(i)}")
    else:
        return cluster.status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
