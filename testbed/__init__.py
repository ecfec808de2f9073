"""The local Kubernetes test bed, importable by the e2e suites, ``make demo`` and ``bench``.

- ``cluster``: the control plane (kwokctl), the fake GPU nodes and the real node's lifecycle
  (``build``, ``up``, ``down``, ``status``), on the pinned binaries of ``toolchain``;
- ``kubectl``: the one kubectl client;
- ``images``: the project's images, built by buildah on a debootstrap base;
- ``realnode``: the real node (containerd, kubelet, kube-proxy);
- ``addons``: cluster DNS and KEDA on the real node;
- ``gitops``: a Git server and Flux's controllers;
- ``kube``: helm against the test bed, polling, namespaces, samples;
- ``netpol``: probe pods and the NetworkPolicy matrix they measure;
- ``operators``: the operator as a local process or installed by the chart;
- ``faults``: the faults the suites inject (daemon restarts, a frozen or restarted API
  server, a killed container);
- ``load`` and ``scenarios``: steady load through a Service and the scaling scenarios;
- ``demo``: ``make demo``.

The command line is ``python -m testbed`` (``testbed/__main__.py``). ``cluster``, ``kubectl``,
``images``, ``realnode``, ``gitops`` and ``addons`` use only the standard library (and
``toolchain`` and ``testkit.host``, which do too), so the test bed builds and starts before
the project's virtual environment exists.
"""
