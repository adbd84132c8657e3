"""mkdocs hooks: the benchmarks' figure, which benchmarks/README.md (included by
docs/performance.md) and docs/guides/memory.md show, served from where the benchmark
writes it rather than copied into docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

FIGURES = ["convergence.png"]


def on_files(files, config):
    """Adds each of ``FIGURES`` from ``benchmarks/`` at the site's root."""
    root = Path(config["config_file_path"]).parent / "benchmarks"
    for name in FIGURES:
        files.append(File.generated(config, name, abs_src_path=str(root / name)))
    return files
