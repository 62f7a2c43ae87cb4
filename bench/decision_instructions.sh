#!/bin/bash
# Instructions per scheduler decision (plan + commit + complete + publish) at ACTIVE requests on the
# 7B/H100 bench catalog, counted by valgrind's callgrind: deterministic, so a loaded machine cannot
# skew a before/after comparison the way wall time can. The difference between 110 and 10 timed
# iterations of helios.sim.overhead.measure, over 100 (the bench's record building is included).
# Run from the repository root: bench/decision_instructions.sh 64   (about 1.5 minutes)
set -eu
# String hashing is salted per process, and the salt moves set and dict layouts enough to shift
# the count by about 2%: pin it, so two trees compare like for like.
export PYTHONHASHSEED=${PYTHONHASHSEED:-0}
active=${1:-64}
py=${PYTHON:-/work/main/.venv/bin/python}
ir() {
  PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null "$py" -c "
from helios.sim.overhead import measure
from helios.sim.costmodel import SyntheticCostModel
measure($active, $1, SyntheticCostModel.realistic_small())" 2>&1 | awk '/Collected/ {print $4}'
}
a=$(ir 10); b=$(ir 110)
echo "active $active: $(( (b - a) / 100 )) instructions per decision"
