#!/bin/sh
# Seventh pass: stand-in check, GPU tests, harness, reap bench, reap timeline.
set -u
R=$OUT; export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/iu-pycache
{ date; uname -a; nproc; python3 --version; uptime; nvidia-smi; git log --oneline -1; } > $R/machine.txt 2>&1
python3 -c "import pynvml, infer_units.helpers.entry" 2>/dev/null
timeout 60 python3 bench/results/2026-12-04-h200-seventh/tools/pynvml_stand_ins.py > $R/pynvml-stand-ins.txt 2>&1; echo "rc=$?" >> $R/pynvml-stand-ins.txt
timeout 120 python3 -m pytest -q -s -rs -p no:cacheprovider tests/gpu > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log
mkdir -p /tmp/harness-out; (cd .gpucarry && OUT=/tmp/harness-out IU_TIME_LIMIT=190 timeout 215 sh run-h200.sh) > $R/harness.log 2>&1; echo "rc=$?" >> $R/harness.log
tar czf $R/harness.tgz -C /tmp harness-out
timeout 150 python3 bench/reap_bench.py --trials 10 --gib 20 --idle 2000 > $R/reap-bench.log 2>&1; echo "rc=$?" >> $R/reap-bench.log
timeout 90 python3 bench/results/2026-12-04-h200-sixth/tools/reap_timeline.py > $R/reap-timeline.txt 2>&1; echo "rc=$?" >> $R/reap-timeline.txt
date >> $R/machine.txt
cat $R/pynvml-stand-ins.txt; tail -3 $R/gpu-tests.log; tail -14 $R/harness.log; grep -E "median|goal|faster" $R/reap-bench.log | head -14; grep -o "rc 0 wall [0-9.]* ms" $R/reap-timeline.txt
