#!/usr/bin/env bash
# `ssh` for the nodes of scripts/netns-cluster.sh: run a command inside a node's network namespace.
#
# Called as ssh is: netns-exec.sh [ssh options] HOST COMMAND...; the options are ignored, HOST is
# a node name (the namespace) or its address (looked up in /run/netns-cluster/*/nodes), and
# COMMAND is run by `sh -c` as ssh's remote shell would. Launchers take it in place of ssh:
#
#   mpirun -launcher ssh -launcher-exec scripts/netns-exec.sh -f HOSTFILE -localhost fgn0 ...
#   (MPICH hydra; Open MPI: --mca plm_rsh_agent scripts/netns-exec.sh)
#
# Exit status: the command's; 255 (as ssh) when HOST is not a node.
set -uo pipefail

STATE_ROOT=${NETNS_CLUSTER_STATE:-/run/netns-cluster}

while (($#)) && [[ $1 == -* ]]; do
    case $1 in
        # ssh options that take a value
        -b | -c | -D | -E | -e | -F | -I | -i | -J | -L | -l | -m | -O | -o | -p | -Q | -R | -S | -W | -w) shift 2 ;;
        --) shift; break ;;
        *) shift ;;
    esac
done
(($# >= 2)) || { echo "netns-exec: usage: netns-exec.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=${1#*@}
shift

ns=""
if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$host"; then
    ns=$host
else
    ns=$(cat "$STATE_ROOT"/*/nodes 2>/dev/null | awk -v h="$host" '$2 == h {print $1; exit}')
fi
[[ -n $ns ]] || { echo "netns-exec: $host: no such node (not a namespace of netns-cluster.sh)" >&2; exit 255; }
# The nodes share one kernel, so UCX (the network module of the mpich wheel and of Open MPI)
# would take them for one host and move data through shared memory, never touching the shaped
# links. As between separate machines, make it use TCP (ranks of one node still talk through
# MPICH's own shared memory). libfabric (MPIR_CVAR_CH4_NETMOD=ofi) likewise: tcp, not shm.
export UCX_TLS=${UCX_TLS:-tcp,self} FI_PROVIDER=${FI_PROVIDER:-tcp}
exec ip netns exec "$ns" sh -c "$*"
