#!/bin/sh
# Eighth pass, final tree: GPU tests, harness (s1-s8, the carry rebuilt from this tree), reap bench.
set -u
R=$OUT; export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/iu-pycache
{ date; uname -a; nproc; python3 --version; uptime; nvidia-smi; stat -fc %T /sys/fs/cgroup; } > $R/machine.txt 2>&1
python3 -c "import pynvml, infer_units.helpers.entry" 2>/dev/null
timeout 120 python3 -m pytest -q -s -rs -p no:cacheprovider tests/gpu > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log
mkdir -p /tmp/harness-out; (cd .gpucarry && OUT=/tmp/harness-out IU_TIME_LIMIT=300 timeout 330 sh run-h200.sh) > $R/harness.log 2>&1; echo "rc=$?" >> $R/harness.log
tar czf $R/harness.tgz -C /tmp harness-out
timeout 200 python3 bench/reap_bench.py --trials 10 --gib 20 --idle 2000 > $R/reap-bench.log 2>&1; echo "rc=$?" >> $R/reap-bench.log
date >> $R/machine.txt
tail -3 $R/gpu-tests.log; tail -16 $R/harness.log; grep -E "median|goal|faster" $R/reap-bench.log | head -14
