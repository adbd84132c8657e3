"""The documentation site (mkdocs.yml, docs/): every Python example of its pages runs and
prints what the page says, and the site builds with warnings as errors.

The examples run through the mechanism of ``test_readme.py`` (``markdown_examples.py``).
A block preceded by ``<!-- no-run: reason -->`` is skipped with that reason. The build
test needs the docs extra (``pip install -e ".[docs]"``; the test extra has it too) and is
skipped, saying so, without it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optimisers
from markdown_examples import examples, run

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCKS = [(page.relative_to(DOCS).as_posix(), *example)
          for page in PAGES for example in examples(page)]


def test_every_page_of_the_navigation_exists_and_has_a_title():
    nav = re.findall(r": (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert {DOCS / page for page in nav} == set(PAGES)
    for page in PAGES:
        assert page.read_text(encoding="utf-8").startswith("# "), page


def test_the_site_has_examples_with_their_output():
    assert len(BLOCKS) >= 30
    assert sum(expected is not None for *_, expected, _ in BLOCKS) >= 25


@pytest.mark.parametrize(("page", "heading", "code", "expected", "no_run"), BLOCKS,
                         ids=[f"{p}-{i}-{h}" for i, (p, h, *_) in enumerate(BLOCKS)])
def test_example_runs(page, heading, code, expected, no_run):
    if no_run:
        compile(code, f"docs/{page} ({heading})", "exec")  # it parses, at least
        pytest.skip(f"marked no-run: {no_run}")
    run(code, expected, f"docs/{page} ({heading})")


def test_a_block_that_does_not_run_says_why():
    marked = [(page, no_run) for page, _, _, _, no_run in BLOCKS if no_run]
    assert marked, "the no-run mechanism is used (docs/guides/devices.md)"
    assert all(len(reason.split()) >= 4 for _, reason in marked), marked


THEIRS = {  # names the issue asks each mapping table to give, in its left column
    "coming-from-torch.md": ["param groups", "lr_scheduler.", "clip_grad_norm_", "swa_utils"],
    "coming-from-optax.md": ["optax.chain", "multi_transform", "masked", "inject_hyperparams",
                             "MultiSteps", "apply_if_finite", "optax.ema"],
}


@pytest.mark.parametrize("page", sorted(THEIRS))
def test_a_mapping_table_names_theirs_and_ours_exist(page):
    rows = re.findall(r"^\| (.*) \| (.*) \|$", (DOCS / page).read_text(encoding="utf-8"),
                      re.M)[2:]
    theirs = " ".join(left for left, _ in rows)
    assert [name for name in THEIRS[page] if name not in theirs] == []
    unknown = []
    for _, ours in rows:
        for span in re.findall(r"`([^`]+)`", ours):
            called = re.findall(r"(?<![\w.\"'])([A-Za-z_]\w*)(?=\(|$)", span)
            unknown += [name for name in called
                        if not hasattr(optimisers, name) and name != "None"]
            if span.startswith("optimisers."):
                try:
                    importlib.import_module(span)
                except ImportError:  # (a package of torch's)
                    assert importlib.util.find_spec("torch") is None, span
    assert unknown == []


def test_the_rules_reference_gives_every_rules_defaults():
    """Each row of docs/rules.md's table, written with its defaults, is the rule made with
    none; every public rule has a row."""
    rows = dict(re.findall(r"^\| `(\w+)` \| `(\w+\(.*?\))` \|",
                           (DOCS / "rules.md").read_text(encoding="utf-8"), re.M))
    public = {name for name, cls in optimisers.RULES.items()  # (and no test's own rule
              if cls is getattr(optimisers, name, None)  # of a public name: Scaled)
              and name in optimisers.__all__ and cls is not optimisers.TreeRule}
    assert sorted(public - set(rows)) == []
    for name, call in rows.items():
        if re.fullmatch(r"\w+\((\w+=.*)?\)", call):  # (not `AccumGrad(n)`, `EMA(rule, ...)`)
            assert eval(call, {"np": np, **vars(optimisers)}) == getattr(optimisers, name)(), \
                call


def test_the_api_reference_has_every_public_name():
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    listed = re.findall(r"^::: optimisers\.(\w+)$", text, re.M)
    assert sorted(listed) == sorted(optimisers.__all__)


def test_the_build_command_is_in_the_readme_and_the_site():
    command = '```bash\npip install -e ".[docs]" && mkdocs build --strict\n```'
    assert command in (DOCS / "index.md").read_text(encoding="utf-8")
    assert command in (ROOT / "README.md").read_text(encoding="utf-8")


def build(folder: Path) -> Path:
    """``mkdocs build --strict`` into ``folder``; skips where mkdocs is not installed."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(folder)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("site"))


def test_the_site_builds_strictly_with_every_page(site):
    for page in PAGES:
        name = page.relative_to(DOCS).with_suffix("")
        html = site / ("index.html" if name.name == "index" else f"{name}/index.html")
        assert html.is_file(), html
        assert 'class="md-nav' in html.read_text(encoding="utf-8"), html
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in optimisers.__all__:
        assert f'id="optimisers.{name}"' in api, name



def test_the_site_reads_offline(site):
    """No page loads a script, a style sheet or a font from another host."""
    fetched = re.compile(r'<(?:script|link|img)[^>]*(?:src|href)="(?:https?:)?//', re.I)
    for html in site.rglob("*.html"):
        assert not fetched.search(html.read_text(encoding="utf-8")), html


def test_the_performance_page_gives_the_current_figures_not_the_log(site):
    html = (site / "performance" / "index.html").read_text(encoding="utf-8")
    assert "Where it stands" in html and "The shapes" in html
    assert "Development log" not in html and "Measured: stop 22" not in html

# ------------------------------------------------------------ looked at in a real browser

SCREENSHOTS = {"landing": "index.html", "guide": "guides/schedules/index.html",
               "api": "api/index.html", "concepts": "concepts/index.html"}


def screenshots() -> Path:
    """Where the screenshots go: ``$OPTIMISERS_SCREENSHOTS``, else docs-screenshots/
    (git-ignored) at the repository's root."""
    return Path(os.environ.get("OPTIMISERS_SCREENSHOTS", ROOT / "docs-screenshots"))


@pytest.mark.parametrize(("name", "page"), SCREENSHOTS.items())
def test_pages_render_in_headless_chromium(site, name, page):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    image = pytest.importorskip("matplotlib.image")
    html = (site / page).read_text(encoding="utf-8")
    assert 'class="md-nav' in html and "<title>404" not in html
    screenshots().mkdir(parents=True, exist_ok=True)
    png = screenshots() / f"{name}.png"
    png.unlink(missing_ok=True)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={png}", "--window-size=1280,900",
                    (site / page).as_uri()], capture_output=True, timeout=120)
    assert png.is_file() and png.stat().st_size > 10_000, png
    pixels = image.imread(png)
    assert pixels.shape[:2] == (900, 1280)
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0, return_counts=True)
    assert len(colours) > 100, f"{png}: {len(colours)} colours, the page looks blank"
    assert counts.max() < 0.95 * counts.sum(), f"{png}: one colour fills the page"
    # the theme's stylesheet applied: its header, a band of one colour neither white nor
    # black across the top (the page without its CSS shows white there, and large icons)
    band = pixels[:40, :, :3].reshape(-1, 3)
    colours, counts = np.unique(band, axis=0, return_counts=True)
    header = colours[counts.argmax()]
    assert counts.max() > 0.9 * len(band), f"{png}: no header band, is the stylesheet loaded?"
    assert 0.3 < float(header.sum()) < 2.5, f"{png}: the header band is {header}"
    if name == "concepts":  # the diagram drawn: its Leafs' green (docs/state-tree.svg)
        rgb = np.round(pixels[..., :3] * 255)
        green = (np.abs(rgb - [200, 230, 201]).max(axis=-1) <= 3).sum()
        assert green > 5000, f"{png}: the state tree diagram is not drawn"
