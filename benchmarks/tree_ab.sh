#!/bin/bash
# One benchmark run turn about in this tree and in a worktree of an earlier revision, so that a change's effect is
# measured against the code before it on the same host in the same minutes (this machine's speed drifts by tens of
# per cent between minutes; a script's own ratio, like offline_throughput.py's engine / loop, is paired inside
# each run, and the tree-against-tree comparison is paired here run by run).
#
#   bash benchmarks/tree_ab.sh REV ROUNDS LINES -- python benchmarks/offline_throughput.py --models k3-small ...
#
# REV: the baseline revision (a worktree of it is made in a temporary folder and removed at the end); ROUNDS: runs
# per side, baseline first in each round; LINES: how many last lines of each run's output to print. The command
# runs from each tree's root with this tree's Python environment (.venv), so only the code differs. PYTHONPATH
# names the side's tree: the environment's editable install of kestrel would otherwise serve this tree's code to
# a script run from the other one (its finder comes after PYTHONPATH); each run first prints the kestrel it got.
set -euo pipefail
rev=$1 rounds=$2 lines=$3
shift 3
[ "${1:-}" = "--" ] && shift
root=$(git rev-parse --show-toplevel)
base=$(mktemp -d)/base
git -C "$root" worktree add -q --detach "$base" "$rev"
trap 'git -C "$root" worktree remove --force "$base"' EXIT
export PATH="$root/.venv/bin:$PATH"
for i in $(seq "$rounds"); do
  for side in before after; do
    tree=$base
    [ "$side" = after ] && tree=$root
    echo "== round $i, $side ($(git -C "$tree" rev-parse --short HEAD)$([ "$side" = after ] && ! git -C "$root" diff --quiet && echo ' + uncommitted'), $(date +%T))"
    (cd "$tree" && export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" \
      && python -c "import kestrel; print('kestrel from', kestrel.__path__[0])" && "$@" 2>&1 \
      | grep -v "loading weights" | tail -n "$lines")
  done
done
