#!/usr/bin/env bash
# `srun -n 2 gputrain train …` under a real Slurm started here (Debian's slurmctld, slurmd and munge, one node, the
# cluster default MpiDefault=none): the ranks must meet over TCP and train as one data-parallel job. Exit 77 (ctest
# reports it skipped, with the line printed) where the daemons are not installed or cannot run here.
# Usage: tests/slurm_local.sh BUILD/gputrain
set -uo pipefail
gt=$(realpath "$1")
skip() {
  echo "skipped: $*"
  exit 77
}
for tool in slurmctld slurmd srun sinfo munged; do
  command -v "$tool" > /dev/null || skip "$tool is not installed (scripts/setup.sh installs slurmd, slurmctld, munge)"
done
[ "$(id -u)" = 0 ] || skip "slurmd must run as root to start jobs"
work=$(mktemp -d /tmp/gt-slurm.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
host=$(hostname -s)
# Ports of this run's own: two daemons, and the launch ports srun needs, away from the tests' other listeners.
base=$((30000 + $$ % 2000 * 8))

# munge: a key of our own and a socket in the work folder (root is refused without --force).
mkdir -p "$work/munge"
head -c 1024 /dev/urandom > "$work/munge/munge.key"
chmod 400 "$work/munge/munge.key"
munged --force --key-file="$work/munge/munge.key" --socket="$work/munge/socket" --pid-file="$work/munge/pid" \
  --log-file="$work/munge/log" --seed-file="$work/munge/seed" || skip "munged does not start: $(tail -2 "$work/munge/log" 2> /dev/null)"
pids+=("$(cat "$work/munge/pid")")

mkdir -p "$work/state" "$work/spool"
node=$(slurmd -C | head -1)
cat > "$work/slurm.conf" << EOF
ClusterName=gputrain-test
SlurmctldHost=$host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 2))-$((base + 7))
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ReturnToService=2
$node
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF="$work/slurm.conf"
slurmctld -D -i > "$work/ctld.out" 2>&1 &
pids+=($!)
slurmd -D > "$work/d.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  sinfo -h -o %t 2> /dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %t 2> /dev/null | grep -q idle ||
  skip "the local Slurm did not come up: $(tail -2 "$work/slurmctld.log" "$work/slurmd.log" 2> /dev/null | tr '\n' ' ')"

cat > "$work/c.yaml" << 'EOF'
name: slurm
seed: 3
device: cpu
data: {format: synthetic, samples: 512, test_samples: 64, input_shape: [8], targets: {classes: 3}, batch_size: 16}
model: {layers: [{type: linear, out_features: 16}, relu, {type: linear, out_features: 3}]}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1, log_every: 8}
EOF
# Plain srun: the cluster default (MpiDefault=none), no --mpi flag.
if ! timeout 120 srun -n 2 -c 1 "$gt" train "$work/c.yaml" --threads 1 --out "$work/run" > "$work/srun.log" 2>&1; then
  echo "srun -n 2 failed:"
  cat "$work/srun.log"
  exit 1
fi
grep -q "rank 0 of 2 (local rank 0, tcp)" "$work/srun.log" || {
  echo "the ranks did not meet over TCP:"
  cat "$work/srun.log"
  exit 1
}
grep -q '"world_size": 2' "$work/run/summary.json" || {
  echo "summary.json does not say 2 ranks: $(cat "$work/run/summary.json")"
  exit 1
}
# With PMIx, as the README's example launches it, the ranks meet through MPI and train to the same weights.
if srun --mpi=list 2>&1 | grep -q pmix; then
  if ! timeout 120 srun --mpi=pmix -n 2 -c 1 "$gt" train "$work/c.yaml" --threads 1 --out "$work/pmix" \
    > "$work/pmix.log" 2>&1; then
    echo "srun --mpi=pmix -n 2 failed:"
    cat "$work/pmix.log"
    exit 1
  fi
  grep -q "rank 0 of 2 (local rank 0, mpi)" "$work/pmix.log" || {
    echo "with --mpi=pmix the ranks did not meet through MPI:"
    cat "$work/pmix.log"
    exit 1
  }
  cmp -s "$work/run/model.safetensors" "$work/pmix/model.safetensors" ||
    echo "note: TCP and MPI runs differ in their last bits (their all-reduce orders differ)"
fi
echo "srun -n 2 trained over TCP, and srun --mpi=pmix over MPI, under a local Slurm ($(srun --version))"
