"""A team's grid across machines, with real tools: two clones (two machines) each run their shard
of a small grid through their own DVC queue, log to one MLflow server with authentication on
loopback, and push to one bare git repository and one DVC remote; a shard submitted again runs
nothing twice; a third clone pulls, and `pbr report` shows every run exactly once. (Runs repeating a
seed are left out of a cell by report's own test, test_report.)"""

import subprocess

import pytest

import fakedata
from project import BIN, ROOT, commit, dvc, env, make_project, mlflow_server, run

pytestmark = [pytest.mark.slow, pytest.mark.longest]

ADMIN_PASSWORD = "admin-password-of-the-test"
USERS = {"alice": "alice-password", "bob": "bob-password"}


def _auth_config(tmp):
    ini = tmp / "basic_auth.ini"
    # EDIT for every known user (a teammate logs runs into the experiment another created); no
    # anonymous access at all.
    ini.write_text("[mlflow]\ndefault_permission = EDIT\n"
                   f"database_uri = sqlite:///{tmp / 'auth.db'}\nadmin_username = admin\n"
                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return ini


def _as(user, uri):
    e = {k: v for k, v in env().items() if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    e["MLFLOW_TRACKING_URI"] = uri
    if user:
        e.update(MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=USERS.get(user, ADMIN_PASSWORD))
    return e


def _cheap_hashes(auth_db):
    """The users' password hashes at the cheapest cost werkzeug takes. The server checks the password
    of every request, and its default scrypt costs about 0.2 CPU s a request (docs/team.md): 97 of
    this test's 246 CPU s (run alone, machine B), an eighth of the whole suite's on CI's two cores.
    Checking stays real: a wrong password and no password are refused below."""
    import sqlite3

    from werkzeug.security import generate_password_hash

    with sqlite3.connect(auth_db) as db:
        for user, password in USERS.items():
            db.execute("UPDATE users SET password_hash = ? WHERE username = ?",
                       (generate_password_hash(password, "pbkdf2:sha256:1"), user))
        assert db.execute("SELECT count(*) FROM users WHERE password_hash LIKE 'pbkdf2:sha256:1$%'").fetchone() == (2,)


def _pbr(repo, uri, user, *args):
    r = subprocess.run([str(BIN / "pbr"), *args], cwd=repo, env=_as(user, uri), capture_output=True, text=True,
                       timeout=600)
    return r


def test_two_machines_share_a_grid_through_one_server_and_one_remote(tmp_path, monkeypatch, pbr_main):
    raw = tmp_path / "raw"
    fakedata.write_cifar(raw, 100, 20, 2)
    extra = {"MLFLOW_AUTH_CONFIG_PATH": str(_auth_config(tmp_path)), "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
             "MLFLOW_FLASK_SERVER_SECRET_KEY": "secret-key-of-the-test"}
    with mlflow_server(tmp_path, "--app-name", "basic-auth", extra_env=extra) as uri:
        from mlflow.server import get_app_client

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
        admin = get_app_client("basic-auth", tracking_uri=uri)
        for user, password in USERS.items():
            admin.create_user(user, password)
        _cheap_hashes(tmp_path / "auth.db")

        origin, store = tmp_path / "origin.git", tmp_path / "dvc-store"
        run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], tmp_path)
        a = make_project(tmp_path / "alice", data__root=str(raw), data__download=False, data__dataset="cifar100",
                         model__width=4, train__epochs=1, train__device="cpu", train__precision="fp32",
                         train__eval_batch_size=256, method__pbr__mc_samples=4)
        dvc(a, "remote", "add", "-d", "team", str(store))
        commit(a, "team remote")
        run(["git", "remote", "add", "origin", str(origin)], a)
        run(["git", "push", "-q", "origin", "main"], a)
        # Each machine runs its array task of examples/slurm_sweep.sh, as SLURM would start it: alice's
        # and bob's at once; bob then submits his task 2 again, alone (`SHARDS=2 sbatch --array=2`: SLURM
        # counts an array of one, SHARDS gives the grid's split), a task that had in fact finished: its
        # run is not run again, and is pushed again.
        names = {}

        def start(machine, user, k, alone=False):
            # POLL_SECONDS: each poll is a `dvc queue status` (~0.6 CPU s); every 5 s cost ~36 polls in all, and
            # every 10 s half that for ~5 s more of waiting, which the other pytest workers fill.
            e = {**_as(user, uri), "REPO": str(origin), "WORK": str(tmp_path / machine), "GRID": "table3",
                 "SEEDS": "1", "JOBS": "1", "SWEEP_ARGS": "--only data.imbalance_ratio=0.1", "POLL_SECONDS": "10",
                 "SLURM_ARRAY_TASK_ID": str(k), "SLURM_ARRAY_TASK_COUNT": "2"}
            if alone:
                e.update(SLURM_ARRAY_TASK_COUNT="1", SHARDS="2")
            return machine, k, subprocess.Popen(["bash", str(ROOT / "examples/slurm_sweep.sh")], cwd=tmp_path, env=e,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def finish(machine, k, proc, alone=False):
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, out[-2000:] + err[-2000:]
            assert f"shard {k}/2: 1 of 2 runs" in err and f"shard {k}/2 of table3: done, 0 failed" in out
            assert ("0 runs queued, 1 already finished or queued" if alone else "1 run queued, 0 already") in err, err
            assert "pushing 1 experiments: c100-" in out, out
            work = tmp_path / machine / f"table3-shard-{k}-of-2"
            names.setdefault(k, set()).update(dvc(work, "exp", "ls", "--name-only").stdout.split())

        for job in [start("alice-node", "alice", 1), start("bob-node", "bob", 2)]:
            finish(*job)
        finish(*start("bob-node", "bob", 2, alone=True), alone=True)
        assert len(names[1]) == 1 and len(names[2]) == 1 and names[1] != names[2]

        c = tmp_path / "carol"
        run(["git", "clone", "-q", str(origin), str(c)], tmp_path)
        listed = set(dvc(c, "exp", "ls", "--name-only", "origin").stdout.split())
        assert listed == names[1] | names[2]
        dvc(c, "exp", "pull", "origin", *sorted(listed))
        assert set(dvc(c, "exp", "ls", "--name-only").stdout.split()) == listed

        def carols(user, *args):
            """`pbr ARGS` on carol's clone as `user` (None: no credentials), in this process: the same main()
            (tests/conftest.py). One refusal below stays a process of its own."""
            for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                monkeypatch.delenv(k, raising=False)
            return pbr_main(*args, cwd=c, env={k: v for k, v in _as(user, uri).items()
                                               if k.startswith("MLFLOW_TRACKING_")})

        rep = carols("alice", "report")
        assert rep.returncode == 0, rep.stderr
        # DER++ and PBR, one seed each (two columns a row).
        assert rep.stdout.count("(n=1)") == 4 and "(n=2)" not in rep.stdout, rep.stdout
        # MLflow prints "View run ... at URL" for each run ended on a server (the report's own run):
        # the table's output is the table.
        assert "View run" not in rep.stdout + rep.stderr, rep.stdout
        from mlflow import MlflowClient

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
        exp_id = MlflowClient(uri).get_experiment_by_name("pbr").experiment_id
        runs = MlflowClient(uri).search_runs([exp_id])
        assert len(runs) == 2 and {x.data.tags["dvc.exp_name"] for x in runs} == listed
        # Two machines' runs differ in the method's keys only: nothing of a machine's own (a path, a host)
        # is a param, which would make a seed run again on another machine a setting of its own in a
        # report cell, not a repeat (report.py's IGNORED_PARAMS; resolved.* are the method's too).
        pa, pb = (x.data.params for x in runs)
        differ = {k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k)}
        assert differ and not {k for k in differ if not k.startswith(("method.", "resolved."))}, differ
        # The team server's page of the training runs (test_mlflow_ui opens such a link in a browser).
        link = carols("bob", "ui")
        assert link.returncode == 0 and link.stdout.strip() == (
            f"{uri}/#/experiments/{exp_id}/runs?workflowType=machine_learning&compareRunsMode=CHART"
            "&searchFilter=tags.pbr.complete%20%3D%20%27true%27"), link.stderr

        # Nobody without credentials gets in, nor with a wrong password.
        for r, who in ((_pbr(c, uri, None, "report"), "asks for an account"),
                       (carols("mallory", "report"), "refused the account 'mallory'")):
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
            assert r.stderr == f"error: MLflow server {uri} {who}: set MLFLOW_TRACKING_USERNAME and " \
                               "MLFLOW_TRACKING_PASSWORD to your account on it\n"
        r = carols(None, "prepare")  # a stage too, before it writes anything
        assert r.returncode == 2 and "set MLFLOW_TRACKING_USERNAME" in r.stderr, r.stderr
        assert not (c / "data/prepared").exists()
