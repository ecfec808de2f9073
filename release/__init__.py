"""What a release publishes, and the scripts `.github/workflows/release.yml` runs.

- ``release.images``: every image a release builds (Dockerfile, build arguments, platforms);
  ``python -m release.images matrix`` is the workflow's build matrix.
- ``release.version``: the one version source (``pyproject.toml``'s ``project.version``) and
  every place that repeats it; ``python -m release.version check|set|from-tag``.
- ``release.chart``: ``helm package`` and ``helm push`` with the pinned helm (``toolchain``).
- ``charts/render_install.py --digests``: ``install.yaml`` with every image pinned by digest.

Only the standard library is used: the workflow runs these before any virtual environment
exists.
"""
