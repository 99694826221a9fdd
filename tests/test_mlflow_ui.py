"""MLflow's UI in a real headless browser: the link that `pbr ui` prints opens on the training runs
(not MLflow 3's GenAI view), where the run list and the metric charts render with the run's values.

Needs Debian's Chromium (`apt-get install chromium`, which .ci/run does) and the playwright package
(the test extras); skipped with that reason elsewhere."""

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from project import BIN, NO_SERVER_JOBS, copy_project, env, free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium")]
# As a sandboxed root process on a machine without a network: no sandbox, no background connections.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]


def test_pbr_ui_opens_on_the_training_runs_and_their_charts(tmp_path, finished):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install -e '.[test]'")
    import json

    from mlflow import MlflowClient

    repo = copy_project(finished, tmp_path / "repo")
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("pbr").experiment_id
    [run] = client.search_runs([exp_id])
    # A run stopped after training (`dvc exp run ... train`): FINISHED, with the same green check in the
    # UI, but no complete run (`pbr report` leaves it out); the link lists the complete ones.
    stopped = client.create_run(exp_id, run_name="stopped-after-train", tags={"pbr.stage.train": "done"})
    client.set_terminated(stopped.info.run_id, "FINISHED")
    acc = json.loads((repo / "reports/metrics.json").read_text())["class_il"]["acc"]

    port = free_port()
    ui = subprocess.Popen([str(BIN / "pbr"), "ui", "--port", str(port)], cwd=repo, env={**env(), **NO_SERVER_JOBS},
                          text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        said = ui.stderr.readline()
        link = re.match(r"open (http://127\.0\.0\.1:\d+/\S+)", said)
        assert link, said
        link = link.group(1)
        deadline = time.time() + 120
        while True:  # the UI server is up once it answers
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert ui.poll() is None and time.time() < deadline, ui.stderr.read()[-2000:]
                time.sleep(0.5)

        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(link)
                page.get_by_text(run.info.run_name).first.wait_for(timeout=60_000)  # the run list
                page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)  # a chart has drawn
                text = page.inner_text("body")
                assert "stopped-after-train" not in text, text[:3000]
                # The filter stands in the search box, to clear for every run (a running one too).
                boxes = page.eval_on_selector_all("input, textarea", "els => els.map(e => e.value)")
                assert "tags.pbr.complete = 'true'" in boxes, boxes
                assert "Model metrics" in text
                # The model-training side of MLflow's GenAI | Model training switch: its navigation
                # (the model registry), not the GenAI one (judges, sessions, evaluation runs).
                assert "Model registry" in text and "Judges" not in text and "Sessions" not in text, text[:1500]
                # The chart of class_il.acc shows the value the evaluate stage wrote.
                assert re.search(rf"class_il\.acc\n{acc:.2f}\n", text), text[:3000]
                page.screenshot(path=str(tmp_path / "ui.png"))
            finally:
                browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)  # pbr ui's group only: the server runs in a session of its own
        ui.wait(timeout=40)
    # Stopped, pbr ui stops its server cleanly: the port is free and no worker printed a traceback.
    said = ui.stderr.read()
    assert ui.returncode == 0 and "MLflow UI stopped" in said and "Traceback" not in said, said[-3000:]
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
