#!/usr/bin/env bash
# Launch a command across the nodes of scripts/netns-cluster.sh, as on a cluster.
#
# Usage:
#   netns-launch.sh mpirun   [-f HOSTFILE] -n RANKS [--] COMMAND...
#   netns-launch.sh torchrun [-f HOSTFILE] -n RANKS [--port 29500] [--] COMMAND...
#
# HOSTFILE lists node names, one a line (default: the host file `netns-cluster.sh up` wrote,
# /run/netns-cluster/fgn/hostfile, or that of --prefix P); RANKS must be a multiple of the node
# count: RANKS / nodes ranks go to each node.
#
#   mpirun:   MPICH hydra with the host file and scripts/netns-exec.sh in place of ssh:
#             mpirun -launcher ssh -launcher-exec netns-exec.sh -f HOSTFILE -localhost P0
#                    -ppn RANKS/N -n RANKS COMMAND
#   torchrun: one `torchrun --nnodes N --nproc-per-node RANKS/N --node-rank I --master-addr
#             NODE1 --master-port PORT --no-python COMMAND` inside each node; the status is the
#             first non-zero one. COMMAND is an executable (e.g. the venv's `fullgraph`).
#
# Bad input (unknown host, RANKS not a multiple of the node count, no command): one line,
# exit 2, nothing started.
set -uo pipefail

PROG=netns-launch
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE_ROOT=${NETNS_CLUSTER_STATE:-/run/netns-cluster}

die() { echo "$PROG: error: $2" >&2; exit "$1"; }

(($# >= 1)) || die 2 "no launcher (usage: $PROG mpirun|torchrun [-f HOSTFILE] -n RANKS -- COMMAND...)"
launcher=$1
shift
[[ $launcher == mpirun || $launcher == torchrun ]] || die 2 "unknown launcher '$launcher' (mpirun or torchrun)"
hostfile="" ranks="" port=29500 prefix=fgn
while (($#)); do
    case $1 in
        -f | --hostfile) (($# >= 2)) || die 2 "$1 needs a file"; hostfile=$2; shift 2 ;;
        -n | -np) (($# >= 2)) || die 2 "$1 needs a rank count"; ranks=$2; shift 2 ;;
        --port) (($# >= 2)) || die 2 "--port needs a value"; port=$2; shift 2 ;;
        --prefix) (($# >= 2)) || die 2 "--prefix needs a value"; prefix=$2; shift 2 ;;
        --) shift; break ;;
        -*) die 2 "unknown option '$1'" ;;
        *) break ;;
    esac
done
(($# >= 1)) || die 2 "no command to launch"
[[ $ranks =~ ^[1-9][0-9]*$ ]] || die 2 "-n '$ranks': give the number of ranks (a positive integer)"
[[ $port =~ ^[1-9][0-9]*$ ]] && ((port < 65536)) || die 2 "--port '$port': not a TCP port"
hostfile=${hostfile:-$STATE_ROOT/$prefix/hostfile}
[[ -r $hostfile ]] || die 2 "host file $hostfile not found (is the cluster up? scripts/netns-cluster.sh up N)"

mapfile -t hosts < <(sed -e 's/#.*//' -e 's/[[:space:]:].*//' "$hostfile" | grep -v '^$')
((${#hosts[@]} >= 1)) || die 2 "host file $hostfile names no host"
known=$(cat "$STATE_ROOT"/*/nodes 2>/dev/null | awk '{print $1}')
for h in "${hosts[@]}"; do
    grep -qx -- "$h" <<<"$known" || die 2 "unknown host '$h' in $hostfile (not a node of any netns cluster; see scripts/netns-cluster.sh status)"
done
nodes=${#hosts[@]}
((ranks % nodes == 0)) || die 2 "$ranks ranks do not divide among the $nodes node(s) of $hostfile (give a multiple of $nodes)"
per_node=$((ranks / nodes))
head_prefix=$(grep -l -- "^${hosts[0]} " "$STATE_ROOT"/*/nodes | head -1 | xargs dirname | xargs basename)

if [[ $launcher == mpirun ]]; then
    mpirun=${MPIRUN:-$(command -v mpirun)}
    [[ -x $mpirun ]] || die 1 "mpirun not found (activate the venv or set MPIRUN)"
    exec "$mpirun" -launcher ssh -launcher-exec "$HERE/netns-exec.sh" -f "$hostfile" \
        -localhost "${head_prefix}0" -ppn "$per_node" -n "$ranks" "$@"
fi

torchrun=${TORCHRUN:-$(command -v torchrun)}
[[ -x $torchrun ]] || die 1 "torchrun not found (activate the venv or set TORCHRUN)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM
for ((i = 0; i < nodes; i++)); do
    ip netns exec "${hosts[i]}" "$torchrun" --nnodes "$nodes" --nproc-per-node "$per_node" \
        --node-rank "$i" --master-addr "${hosts[0]}" --master-port "$port" --no-python "$@" &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do
    wait "$p"
    rc=$?
    ((status == 0)) && status=$rc
done
exit "$status"
