#!/usr/bin/env bash
# One shard of a paper grid per SLURM array task: each task clones the team's repository, queues
# its K-th of N parts of the grid (`pbr sweep --shard K/N`, balanced by expected cost), runs them
# through its own DVC queue, and pushes the finished experiments to the team's git and DVC remotes.
# Every run logs to the team's MLflow server as it goes. Any machine then sees everything:
#   git pull && dvc exp pull -A origin && pbr report
#
# Usage (array indices start at 1; N = the array's size):
#   export REPO=git@github.com:our-lab/pbr.git MLFLOW_TRACKING_URI=https://mlflow.our-lab.org
#   export MLFLOW_TRACKING_USERNAME=alice MLFLOW_TRACKING_PASSWORD=...   # or from a file: docs/team.md
#   GRID=table2 SEEDS=5 sbatch --array=1-3 examples/slurm_sweep.sh
# One task submitted again alone needs the array's size: SHARDS=3 sbatch --array=2 examples/slurm_sweep.sh
# A re-queued array task runs its shard again in its clone: the runs that finished there are not
# run again, the others start again; a run repeated elsewhere counts once in the report (the newest),
# and the experiments replace their earlier copies on the git remote.
#SBATCH --job-name=pbr-sweep
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=16
#SBATCH --time=2-00:00:00
#SBATCH --output=pbr-sweep-%A-%a.out
set -euo pipefail
: "${REPO:?set REPO to the git remote of the team (holding params.yaml and the config of the DVC remote)}"
: "${MLFLOW_TRACKING_URI:?set MLFLOW_TRACKING_URI to the MLflow server of the team}"
: "${MLFLOW_TRACKING_USERNAME:?set MLFLOW_TRACKING_USERNAME (and MLFLOW_TRACKING_PASSWORD) to your account}"
: "${SLURM_ARRAY_TASK_ID:?submit it as an array job: sbatch --array=1-N examples/slurm_sweep.sh}"
GRID=${GRID:-table2}      # a grid of `pbr sweep`
SEEDS=${SEEDS:-5}
JOBS=${JOBS:-4}           # runs at once on this machine (4 saturate one H200: docs/benchmarks.md)
BRANCH=${BRANCH:-main}    # every task must plan from the same commit, params.yaml and options
SWEEP_ARGS=${SWEEP_ARGS:-}  # more options for every task alike, e.g. "-S data.root=/shared/data" (GRID=fidelity: "--budget proxy")
K=$SLURM_ARRAY_TASK_ID
N=${SLURM_ARRAY_TASK_COUNT:?}
if [ -n "${SHARDS:-}" ] && [ "$SHARDS" != "$N" ]; then  # one task submitted alone: SLURM counts an array of one
  if [ "$N" != 1 ]; then
    echo "SHARDS=$SHARDS but this array has $N tasks: unset SHARDS (it is for one task submitted alone)" >&2; exit 2
  fi
  N=$SHARDS
fi
if [ "$K" -lt 1 ] || [ "$K" -gt "$N" ]; then
  echo "array task $K of $N: submit --array=1-$N (or one task K <= N alone with SHARDS=N)" >&2; exit 2
fi
WORK=${WORK:-${SCRATCH:-$HOME}/pbr-sweep}/$GRID-shard-$K-of-$N

if [ ! -d "$WORK/.git" ]; then
  git clone -q --branch "$BRANCH" "$REPO" "$WORK"
fi
cd "$WORK"
git pull -q --ff-only origin "$BRANCH"
# This clone's code runs (and its commit is what the runs record), not that of the checkout `pip
# install -e` was run in; the queue's workers inherit it.
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
pbr sweep "$GRID" --seeds "$SEEDS" --shard "$K/$N" $SWEEP_ARGS --jobs "$JOBS"
while sleep "${POLL_SECONDS:-60}"; status=$(dvc queue status); grep -qE '(Queued|Running) *$' <<<"$status"; do
  if grep -qE 'Worker status: 0 active, 0 idle' <<<"$status"; then  # the workers died: nothing will end
    echo "no queue worker left, runs unfinished: submit this task again (its dead runs are queued again)" >&2
    break
  fi
done
# The experiments this queue finished (named: without names dvc pushes none): their git refs to
# REPO, their outputs to the DVC remote. --force: a re-queued task's runs replace earlier copies.
# A name that failed on an earlier try and succeeded since is not a failure.
status=$(dvc queue status)
mapfile -t done_names < <(awk '$NF == "Success" {print $2}' <<<"$status" | sort -u)
failed=$(awk '$NF == "Failed" {f[$2] = 1} $NF == "Success" {ok[$2] = 1}
              $NF ~ /^(Queued|Running)$/ {f[$2] = 1}
              END {n = 0; for (k in f) if (!(k in ok)) n++; print n}' <<<"$status")
dvc queue stop >/dev/null 2>&1 || true
echo "pushing ${#done_names[@]} experiments: ${done_names[*]}"
if [ "${#done_names[@]}" -gt 0 ]; then
  dvc exp push --force origin "${done_names[@]}"
fi
# Runs recorded while the server was unreachable from this node are in $WORK/mlflow-offline/ (on a
# scratch disk that may be purged): copied to the server now, or the job fails saying where they are.
if [ -e "$WORK/mlflow-offline" ]; then
  if pbr import mlflow-offline; then
    echo "imported the runs recorded while the MLflow server was unreachable (mlflow-offline/)"
  else
    echo "runs recorded offline are in $WORK/mlflow-offline: run \`pbr import $WORK/mlflow-offline\` where the server is reachable" >&2
    failed=$((failed + 1))
  fi
fi
echo "shard $K/$N of $GRID: done, $failed failed or unfinished (dvc queue logs NAME shows why)"
[ "$failed" -eq 0 ]
