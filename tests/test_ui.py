"""Both UIs in a real browser, as a user drives them: `scripts/ui.sh` (dg dev: webserver and
daemon) and `scripts/mlflow_ui.sh` (the MLflow server over the SQLite store) on free ports of
127.0.0.1 with a temporary state folder, driven by Playwright through Debian's Chromium
(`apt-get install chromium`; Playwright is only the driver, its own browser download is never used).

One pair of servers and one run of `tiny_pipeline`, launched from the launchpad, serve every test.
Each test opens its own browser context (a fresh profile) and saves screenshots into one folder,
listed at the end of the session. Without Chromium the tests are skipped, except under CI (`CI`
set), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import SCREENSHOTS
from cli import BIN, ROOT, env_for, instance, materializations, mlflow_runs, step_errors

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Headless and quiet: no GPU, no network beyond the two servers, no first-run pages.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1600, "height": 1000}
LANGUAGE_MODELS = ["rnn_lm", "lstm_lm", "transformer_lm"]
EXPERIMENT = "wordvec-to-transformer"
# Bounded waits, generous for a loaded 2-core machine.
UI_TIMEOUT_MS = 60_000
SERVER_START_S = 240
RUN_TIMEOUT_MS = 600_000
STOP_GRACE_S = 5.0

# Headless Chromium through both UIs, against Dagster and MLflow servers the tests start.
pytestmark = [pytest.mark.browser, pytest.mark.services]

if not Path(CHROMIUM).exists():
    reason = f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)"
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

expect.set_options(timeout=UI_TIMEOUT_MS)


# --- servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[dict]:
    """The live (non-zombie) processes of process group `pgid`: pid, resident bytes, command line."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ... rss at 21
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append({"pid": int(d.name), "rss": int(fields[21]) * os.sysconf("SC_PAGE_SIZE"), "cmd": cmd})
    return out


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each server's process group, wait a little, then SIGKILL what is left (`dagster dev`
    ignores SIGTERM for over 15 s)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()  # reap the group leader
        if not any(group_members(p.pid) for p in procs):
            return
        time.sleep(0.2)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)


def wait_until_up(proc: subprocess.Popen, url: str, log: Path, deadline: float) -> None:
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: not up within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """`scripts/ui.sh` and `scripts/mlflow_ui.sh` on free ports, each in its own process group,
    stopped by that group's id whatever the tests did."""
    base = tmp_path_factory.mktemp("ui")
    state = base / "state"
    dagster_url, mlflow_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    env = {**env_for(state), "DAGSTER_UI_URL": dagster_url, "MLFLOW_UI_URL": mlflow_url, "VENV": str(BIN.parent)}
    for unset in ("PORT", "MLFLOW_TRACKING_URI"):  # the scripts' other address settings: not these servers'
        env.pop(unset, None)
    procs, logs = [], {}
    try:
        for name in ("ui", "mlflow_ui"):
            logs[name] = base / f"{name}.log"
            with open(logs[name], "w") as log:
                procs.append(subprocess.Popen(["bash", f"scripts/{name}.sh"], cwd=ROOT, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + SERVER_START_S
        wait_until_up(procs[0], f"{dagster_url}/server_info", logs["ui"], deadline)
        wait_until_up(procs[1], f"{mlflow_url}/health", logs["mlflow_ui"], deadline)
        yield {"state": state, "dagster": dagster_url, "mlflow": mlflow_url, "procs": dict(zip(logs, procs)), "logs": logs}
    finally:
        stop(procs)


# --- browser ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory, request):
    """Where every screenshot goes; listed at the end of the session."""
    folder = tmp_path_factory.mktemp("screenshots")
    yield folder
    request.config.stash.setdefault(SCREENSHOTS, []).extend(sorted(folder.glob("*.png")))


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def dismiss_first_run_dialogs(page: Page) -> None:
    """Whenever they cover the page: Dagster's "Join the Dagster community" dialog (shown to a fresh
    browser profile unless dagster.yaml turns `nux` off, as the state folder's does), and MLflow's
    feature tips."""
    community = page.get_by_role("dialog").filter(has_text="Join the Dagster community")
    page.add_locator_handler(community, lambda: community.get_by_role("button", name="Skip").click())
    tip = page.get_by_role("button", name="Got it")
    page.add_locator_handler(tip, lambda: tip.click())


def open_page(browser, **options) -> Page:
    """A page in a fresh browser context (its own profile: cookies, local storage)."""
    ctx = browser.new_context(viewport=VIEWPORT, **options)
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    page = ctx.new_page()
    dismiss_first_run_dialogs(page)
    return page


@pytest.fixture
def new_page(browser):
    pages = []

    def make(**options) -> Page:
        pages.append(open_page(browser, **options))
        return pages[-1]

    yield make
    for page in pages:
        page.context.close()


def close_mlflow_assistant(page: Page) -> None:
    """MLflow 3.17 opens its assistant panel beside the page on a first visit."""
    close = page.get_by_role("button", name="Close")
    if close.count():
        close.first.click()


# --- the run, launched from the launchpad ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(servers, browser, screenshots):
    """`tiny_pipeline` launched from its launchpad (pre-filled from configs/tiny.yaml); the run page
    is watched until it shows the run's end."""
    page = open_page(browser)
    try:
        page.goto(f"{servers['dagster']}/jobs")
        page.get_by_role("link", name="tiny_pipeline").click()
        page.get_by_role("button", name="Materialize all").wait_for()
        page.get_by_role("button", name="arrow_drop_down").last.click()  # beside "Materialize all"
        page.get_by_role("menuitem", name="Open launchpad").click()
        launchpad = page.get_by_role("dialog").filter(has=page.get_by_text("Launchpad (configure assets)"))
        expect(launchpad).to_contain_text("max_documents: 24")  # configs/tiny.yaml, as the job carries it
        page.screenshot(path=screenshots / "dagster_launchpad.png")
        launchpad.get_by_role("button", name="Materialize").click()
        page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
        run_id = re.search(r"/runs/([0-9a-f-]{36})", page.url).group(1)
        ended = page.get_by_role("img", name=re.compile(r"^run_(success|failed|canceled)$"))
        expect(ended).to_be_visible(timeout=RUN_TIMEOUT_MS)
        page.screenshot(path=screenshots / "dagster_run.png")
        status = ended.get_attribute("aria-label")
    finally:
        page.context.close()
    return {"run_id": run_id, "status": status}


def test_the_tiny_job_launched_from_the_launchpad_succeeds(servers, tiny_run):
    from dagster import DagsterEventType, DagsterRunStatus
    from dagster_graphql import DagsterGraphQLClient

    run_id = tiny_run["run_id"]
    inst = instance(servers["state"])
    assert tiny_run["status"] == "run_success", step_errors(inst, run_id)
    # What the page showed is what the webserver's API and the instance record.
    port = int(servers["dagster"].rsplit(":", 1)[1])
    assert DagsterGraphQLClient("127.0.0.1", port_number=port).get_run_status(run_id) == DagsterRunStatus.SUCCESS
    run = inst.get_run_by_id(run_id)
    assert run.job_name == "tiny_pipeline" and run.status == DagsterRunStatus.SUCCESS
    # tiny.yaml's executor: the steps ran one after another in the run's process.
    engine = [e.message for e in inst.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)]
    assert any(m.startswith("Executing steps in process") for m in engine), engine
    assert run.tags["mlflow/parent_run_url"].startswith(servers["mlflow"] + "/#/experiments/")


def test_asset_graph_shows_every_asset_materialized(servers, tiny_run, new_page, screenshots):
    """The global asset graph, every group expanded: one node per asset of the Definitions; the
    tiny job's (the default route: all but the sharded-corpus group) marked materialized by the run."""
    from pipelines.definitions import DEFAULT_ROUTE, defs

    graph = defs.resolve_asset_graph()
    names = sorted(k.to_user_string() for k in graph.get_all_asset_keys())
    groups = {graph.get(k).group_name for k in graph.get_all_asset_keys()}
    page = new_page(device_scale_factor=2)  # small labels stay legible in the screenshot
    page.goto(f"{servers['dagster']}/asset-groups")
    for group in groups:
        expect(page.get_by_text(group, exact=True).first).to_be_visible()
    # Lay the graph out top-down and expand every group; it is fitted to the window when it loads.
    page.get_by_role("button", name="settings", exact=True).click()
    page.get_by_role("menuitem", name="Change graph to vertical orientation").click()
    page.get_by_role("button", name="settings", exact=True).click()
    page.get_by_role("menuitem", name="Expand all groups").click()
    page.reload()
    nodes = page.locator("[class*=AssetNode_assetName]")
    expect(nodes).to_have_count(len(names))
    labels = nodes.all_inner_texts()
    # Zoomed out, long names are shortened in the middle (`transfo…_ablations`): each label must
    # stand for exactly one asset, and each asset have its label.
    matches = {label: [n for n in names if label_matches(label, n)] for label in labels}
    assert all(len(m) == 1 for m in matches.values()), matches
    assert sorted(m[0] for m in matches.values()) == names
    # A zoomed-out node is green once its latest materialization is loaded (Dagster 1.13's style).
    # Every asset of the route is green; of the others, a partitioned asset with no partitions yet
    # may be drawn green too (none of its partitions is missing), so they are not counted.
    route = sorted(k.to_user_string() for k in DEFAULT_ROUTE.resolve(graph))
    assert 0 < len(route) < len(names)
    green = page.locator("[class*=AssetNode_minimalAssetNodeBox][style*=background-green]")
    expect(green).not_to_have_count(0)

    def green_names() -> set[str]:
        return {n for label in green.all_inner_texts() for n in names if label_matches(label.strip(), n)}

    deadline = time.monotonic() + 60
    while not set(route) <= green_names() and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert set(route) <= green_names(), sorted(set(route) - green_names())
    box = page.evaluate("""() => {
        const r = [...document.querySelectorAll('[class*=AssetNode_assetNodeContainer], [class*=GroupNode]')]
          .map(e => e.getBoundingClientRect()).filter(b => b.width > 0);
        const x = Math.min(...r.map(b => b.left)), y = Math.min(...r.map(b => b.top));
        return {x: x - 16, y: y - 16, width: Math.max(...r.map(b => b.right)) - x + 32, height: Math.max(...r.map(b => b.bottom)) - y + 32};
    }""")
    controls = "[class*=SVGViewport_zoomSliderContainer], [class*=SVGViewport_iconButton] { visibility: hidden; }"
    page.screenshot(path=screenshots / "dagster_asset_graph.png", clip=box, style=controls)


def label_matches(label: str, name: str) -> bool:
    if "…" not in label:
        return label == name
    head, tail = label.split("…", 1)
    return name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail)


def test_asset_page_links_to_its_mlflow_run(servers, tiny_run, new_page, screenshots):
    """transformer_lm's asset page → its `mlflow_url` → that very MLflow run, in the model-training view."""
    run_id = tiny_run["run_id"]
    mat = materializations(instance(servers["state"]), run_id)["transformer_lm"]
    mlflow_run_id = mat.metadata["mlflow_run_id"].value
    page = new_page()
    page.goto(f"{servers['dagster']}/assets/transformer_lm")
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name="mlflow_url", exact=True))
    link = row.get_by_role("link").first
    expect(link).to_have_attribute("href", re.compile(re.escape(f"{servers['mlflow']}/#/experiments/") + r"\d+/runs/" + mlflow_run_id))
    page.screenshot(path=screenshots / "dagster_transformer_lm.png")
    with page.context.expect_page() as opened:
        link.click()  # opens a new tab
    mlflow = opened.value
    expect(mlflow.get_by_role("heading", name="transformer_lm", exact=True)).to_be_visible()
    expect(mlflow.get_by_text(mlflow_run_id, exact=True)).to_be_visible()  # "Run ID" on the overview
    expect(mlflow.get_by_role("link", name=f"tiny_pipeline:{run_id[:8]}")).to_be_visible()  # its parent run
    expect(mlflow.get_by_role("link", name="Model registry")).to_be_visible()  # the model-training view's sidebar
    close_mlflow_assistant(mlflow)
    mlflow.screenshot(path=screenshots / "mlflow_transformer_lm_run.png")
    client, _ = mlflow_runs(servers["state"])
    tags = client.get_run(mlflow_run_id).data.tags
    assert tags["dagster.run_id"] == run_id and tags["dagster.asset_key"] == "transformer_lm"


def open_experiment_runs(page: Page, mlflow_url: str) -> None:
    """MLflow from its front page: the experiment, then the model-training view's run list."""
    page.goto(f"{mlflow_url}/#/experiments")
    page.get_by_role("link", name=EXPERIMENT, exact=True).click()
    page.get_by_text("Model training", exact=True).click()  # the GenAI / model-training switch (kept per browser)
    page.wait_for_url(re.compile(r"/runs\?.*workflowType=machine_learning"))
    close_mlflow_assistant(page)


def expand_parent(page: Page, run_id: str) -> None:
    parent = page.get_by_role("gridcell", name=re.compile(f"tiny_pipeline:{run_id[:8]}"))
    parent.get_by_role("button").click()


def run_name_link(page: Page, name: str):
    return page.locator('[col-id="attributes.`Run Name`"]').get_by_role("link", name=name, exact=True)


def test_mlflow_lists_the_experiment_parent_and_nested_runs(servers, tiny_run, new_page, screenshots):
    run_id = tiny_run["run_id"]
    _, all_runs = mlflow_runs(servers["state"])
    page = new_page()
    open_experiment_runs(page, servers["mlflow"])
    expect(page.get_by_text(f"{len(all_runs)} matching runs")).to_be_visible()
    expand_parent(page, run_id)
    for name in LANGUAGE_MODELS:
        expect(run_name_link(page, name)).to_be_visible()
    page.screenshot(path=screenshots / "mlflow_runs.png")


def test_mlflow_registry_holds_the_language_models(servers, tiny_run, new_page, screenshots):
    client, _ = mlflow_runs(servers["state"])
    registered = {m.name for m in client.search_registered_models()}
    assert set(LANGUAGE_MODELS) <= registered, registered
    page = new_page()
    open_experiment_runs(page, servers["mlflow"])
    page.get_by_role("link", name="Model registry").click()
    table = page.get_by_role("main").get_by_role("table")
    for name in sorted(registered):
        row = table.get_by_role("row").filter(has=page.get_by_role("link", name=name, exact=True))
        expect(row).to_contain_text("Version 1")
    page.screenshot(path=screenshots / "mlflow_registry.png")


def test_mlflow_compare_view_of_the_three_language_models(servers, tiny_run, new_page, screenshots):
    """Select rnn_lm, lstm_lm, transformer_lm under the run's parent, then "Compare"."""
    run_id = tiny_run["run_id"]
    client, all_runs = mlflow_runs(servers["state"])
    ids = {r.data.tags.get("dagster.asset_key"): r.info.run_id for r in all_runs
           if r.data.tags.get("dagster.run_id") == run_id and r.data.tags.get("dagster.role") != "dagster_run"}
    page = new_page()
    open_experiment_runs(page, servers["mlflow"])
    expand_parent(page, run_id)
    for name in LANGUAGE_MODELS:
        page.get_by_role("row").filter(has=run_name_link(page, name)).get_by_role("checkbox").first.check()
    page.get_by_role("button", name="Compare", exact=True).click()
    expect(page.get_by_role("heading", name="Comparing 3 Runs from 1 Experiment")).to_be_visible()
    names = page.get_by_role("row", name=re.compile("^Run Name:")).get_by_role("cell")
    shown = names.all_inner_texts()
    assert sorted(shown) == sorted(LANGUAGE_MODELS), shown
    for name in LANGUAGE_MODELS:
        expect(page.get_by_role("link", name=ids[name], exact=True)).to_be_visible()
    # The parallel-coordinates plot on the figures model_comparison ranks them by.
    plot = page.get_by_role("tabpanel", name="Parallel Coordinates Plot")
    plot.get_by_role("button", name="Clear All").click()
    metrics = plot.get_by_role("combobox").nth(1)
    for metric in ["params", "train/tokens_per_s_mean", "val/best_loss"]:
        metrics.click()
        metrics.fill(metric)
        page.get_by_role("option", name=metric, exact=True).wait_for(state="attached")
        metrics.press("Enter")
    page.keyboard.press("Escape")
    expect(plot.get_by_text("val/best_loss").last).to_be_visible()
    page.screenshot(path=screenshots / "mlflow_compare.png")


def test_mlflow_server_runs_two_workers_and_no_job_runner(servers):
    """scripts/mlflow_ui.sh: two uvicorn workers, no GenAI job-runner processes."""
    members = group_members(servers["procs"]["mlflow_ui"].pid)
    cmds = [m["cmd"] for m in members]
    workers = [c for c in cmds if "multiprocessing.spawn" in c]
    assert len(workers) == 2, cmds
    assert not [c for c in cmds if "mlflow.server.jobs" in c or "huey" in c], cmds
    rss_mib = sum(m["rss"] for m in members) / 2**20
    print(json.dumps({"mlflow_processes": len(members), "rss_mib": round(rss_mib)}))
