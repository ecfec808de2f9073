"""The local Kubernetes test bed, importable by the e2e suites, ``make demo``, ``bench`` and
the release scripts.

- ``cluster``: the pinned binaries, the control plane (kwokctl), the fake GPU nodes and the
  real node's lifecycle (``build``, ``up``, ``down``, ``status``);
- ``images``: the project's images, built by buildah on a debootstrap base;
- ``realnode``: the real node (containerd, kubelet, kube-proxy);
- ``addons``: cluster DNS and KEDA on the real node;
- ``kube``: kubectl and helm against the test bed, polling, namespaces, samples;
- ``operators``: the operator as a local process or installed by the chart;
- ``load`` and ``scenarios``: steady load through a Service and the scaling scenarios;
- ``demo``: ``make demo``.

The command line is ``python -m testbed`` (``testbed/__main__.py``). ``cluster``, ``images``,
``realnode`` and ``addons`` use only the standard library, so the test bed builds and starts
before the project's virtual environment exists.
"""
