#!/usr/bin/env bash
# A real Slurm cluster on one machine, on the nodes of scripts/netns-cluster.sh: slurmctld in the
# root namespace (reached by the nodes at the bridge address SUBNET.254), one slurmd inside each
# node's network namespace (`ip netns exec NODE slurmd -N NODE`, its own NodeName, address,
# CPUs and RealMemory), and a munged of the cluster's own (own key and socket). srun, sbatch,
# sinfo, squeue and scancel then work as on any Slurm cluster, from the root namespace (the
# login node) and from inside the nodes.
#
# Usage:
#   slurm-cluster.sh up N [--prefix fgn] [--subnet 10.77.0] [--rate 10gbit] [--cpus C]
#                         [--memory MB] [--port 6817] [--partition debug] [--no-install]
#   slurm-cluster.sh status [--prefix fgn]
#   slurm-cluster.sh env [--prefix fgn]      (prints `export SLURM_CONF=...`)
#   slurm-cluster.sh down [--prefix fgn]
#   slurm-cluster.sh install                 (apt-get install slurmctld slurmd slurm-client munge)
#
# The nodes: those of `netns-cluster.sh up N --prefix P` when that cluster is up with N nodes
# (they are shared, and left up by `down`); otherwise `up` makes them (--subnet, --rate) and
# `down` removes them. Nodes PREFIX1..PREFIXN, partition --partition (default, every node),
# CPUs=--cpus (default: this machine's cores) and RealMemory=--memory MB per node (default: this
# machine's memory / N); slurmd reports the configured values (SlurmdParameters=config_overrides).
# No cgroups (proctrack/linuxproc, task/none, jobacct_gather/none), ReturnToService=2,
# SlurmdTimeout 10 s (a node that stops answering is down after 10 s and its jobs end).
#
# State (config, controller state, spool and logs of every daemon, munge key and socket):
# /run/slurm-cluster/PREFIX/. Clients find the config through SLURM_CONF (`eval "$(slurm-cluster.sh
# env)"`); where /etc/slurm/slurm.conf does not exist, `up` also links it there (and `down`
# removes the link), so that plain `srun` works. The ranks' environment gets UCX_TLS=tcp,self and
# FI_PROVIDER=tcp unless set (a TaskProlog), as with netns-exec.sh: the nodes share one kernel,
# and MPI would otherwise move data through shared memory rather than over the links. Each node
# has a private tmpfs at /run/slurm-cluster/PREFIX/node-local (256 MiB), its local scratch:
# mounted in its slurmd's mount namespace, seen by its jobs only.
#
# `up` installs the Debian packages when a command is missing (unless --no-install; about 10 s),
# waits until sinfo shows every node idle, and is idempotent (a cluster that is up and answering
# is left as it is; a broken one, such as one whose slurmd died, is restarted with its settings).
# A failed `up` rolls back (nothing left). `down` ends every job process, every daemon, and
# removes the state, the config link and the nodes it made (with their /etc/hosts lines).
#
# SLURM_CLUSTER_KEEP_FAILED=1 keeps what a failed `up` started, logs included, for a look at
# /run/slurm-cluster/PREFIX/log (then `down`).
#
# Exit status: 0 done; 1 this machine cannot (not root, no namespaces, packages not installable,
# a daemon would not start: one line naming it, rolled back); 2 bad input (one line, nothing
# changed).
set -euo pipefail

PROG=slurm-cluster
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETNS_SH=$HERE/netns-cluster.sh
STATE_ROOT=${SLURM_CLUSTER_STATE:-/run/slurm-cluster}
NETNS_STATE=${NETNS_CLUSTER_STATE:-/run/netns-cluster}
ETC_CONF=${SLURM_CLUSTER_ETC_CONF:-/etc/slurm/slurm.conf}
PACKAGES=(slurmctld slurmd slurm-client munge)
IDLE_WAIT_S=${SLURM_CLUSTER_IDLE_WAIT_S:-60}

die() { # die CODE MESSAGE: one line on stderr, exit CODE
    echo "$PROG: error: $2" >&2
    exit "$1"
}
usage_error() { die 2 "$1 (see $PROG --help)"; }
note() { echo "$PROG: $1" >&2; }

# -- options ---------------------------------------------------------------------------------
PREFIX=fgn SUBNET="" RATE=10gbit CPUS="" MEMORY="" PORT=6817 PARTITION=debug INSTALL=1
SEEN_PORT=0 SEEN_PARTITION=0

parse_options() { # sets the globals above from "$@"
    while (($#)); do
        case $1 in
            --prefix | --subnet | --rate | --cpus | --memory | --port | --partition)
                (($# >= 2)) || usage_error "$1 needs a value"
                case $1 in
                    --prefix) PREFIX=$2 ;;
                    --subnet) SUBNET=$2 ;;
                    --rate) RATE=$2 ;;
                    --cpus) CPUS=$2 ;;
                    --memory) MEMORY=$2 ;;
                    --port) PORT=$2 SEEN_PORT=1 ;;
                    --partition) PARTITION=$2 SEEN_PARTITION=1 ;;
                esac
                shift 2
                ;;
            --no-install) INSTALL=0 && shift ;;
            *) usage_error "unknown argument '$1'" ;;
        esac
    done
    [[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
        usage_error "--prefix $PREFIX: use 1-8 lower-case letters and digits, starting with a letter"
    [[ -z $CPUS || $CPUS =~ ^[1-9][0-9]{0,3}$ ]] || usage_error "--cpus $CPUS: give a positive whole number"
    [[ -z $MEMORY || $MEMORY =~ ^[1-9][0-9]{0,8}$ ]] || usage_error "--memory $MEMORY: give megabytes (a positive whole number)"
    { [[ $PORT =~ ^[1-9][0-9]{0,4}$ ]] && ((PORT >= 1024 && PORT < 65535)); } ||
        usage_error "--port $PORT: give a TCP port in 1024..65534 (the controller's; slurmd uses PORT+1 in every node)"
    [[ -z $SUBNET || $SUBNET =~ ^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){2}$ ]] ||
        usage_error "--subnet $SUBNET: give the first three octets of a /24, e.g. 10.77.0"
    [[ ${RATE,,} =~ ^[0-9]+(\.[0-9]+)?([kmgt]i?)?(bit|bps)$ ]] ||
        usage_error "--rate $RATE: not a rate tc understands (e.g. 1gbit, 10gbit, 500mbit)"
    [[ $PARTITION =~ ^[A-Za-z][A-Za-z0-9_-]{0,31}$ ]] || usage_error "--partition $PARTITION: not a partition name"
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die 1 "needs root (network namespaces, and slurmd runs jobs as any user); run it with sudo"
}

state_dir() { echo "$STATE_ROOT/$PREFIX"; }
conf() { echo "$(state_dir)/slurm.conf"; }
node() { echo "$PREFIX$1"; }

# -- packages --------------------------------------------------------------------------------
missing_commands() { # the commands of the packages that are not found
    local c
    for c in slurmctld slurmd srun sbatch sinfo scontrol scancel munged mungekey munge; do
        command -v "$c" >/dev/null 2>&1 || echo "$c"
    done
}

install_packages() { # apt-get install the packages when a command is missing (exit 1 if it cannot)
    local missing
    missing=$(missing_commands | tr '\n' ' ')
    [[ -z $missing ]] && return 0
    ((INSTALL)) || die 1 "not installed: ${missing% } (apt-get install ${PACKAGES[*]}, or drop --no-install)"
    command -v apt-get >/dev/null 2>&1 ||
        die 1 "not installed: ${missing% }; no apt-get here: install Slurm (slurmctld, slurmd, the clients) and munge with this system's package manager"
    note "installing Debian's ${PACKAGES[*]} (apt-get, about 10 s; missing: ${missing% })"
    local out
    # No daemon of the packages' own is started: this script starts its own, with its own state.
    if ! out=$(DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${PACKAGES[@]}" 2>&1); then
        out=$( (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends "${PACKAGES[@]}") 2>&1) ||
            die 1 "apt-get install ${PACKAGES[*]} failed: $(echo "$out" | grep -v '^\s*$' | tail -1)"
    fi
    missing=$(missing_commands | tr '\n' ' ')
    [[ -z $missing ]] || die 1 "still missing after apt-get install: ${missing% }"
}

# -- processes -------------------------------------------------------------------------------
descendants() { # descendants PID...: the processes below them (not themselves)
    local all
    all=$(ps -e -o pid=,ppid=)
    awk -v roots="$*" 'BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2; pids[NR] = $1 }
        END { changed = 1
              while (changed) { changed = 0
                  for (i in pids) { p = pids[i]
                      if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; out[p] = 1; changed = 1 } } }
              for (p in out) print p }' <<<"$all"
}

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

read_pid() { if [[ -r $1 ]]; then tr -dc '0-9' <"$1"; fi; }

our_daemons() { # pids of slurmctld/slurmd/munged whose command line names this cluster's state
    local p cmd d
    d=$(state_dir)
    for p in /proc/[0-9]*; do
        cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
        case $cmd in
            *slurmctld*"$d/"* | *slurmd*"$d/"* | *munged*"$d/"*) echo "${p#/proc/}" ;;
        esac
    done
}

stepds() { # slurmstepd processes inside this cluster's nodes
    local n p
    for n in $(node_names); do
        for p in $(ip netns pids "$n" 2>/dev/null); do
            [[ $(cat "/proc/$p/comm" 2>/dev/null) == slurmstepd ]] && echo "$p"
        done
    done
    return 0
}

node_names() { # the nodes of this Slurm cluster (its state), else of the netns cluster
    local f
    for f in "$(state_dir)/nodes" "$NETNS_STATE/$PREFIX/nodes"; do
        if [[ -r $f ]]; then
            awk '{print $1}' "$f"
            return 0
        fi
    done
}

stop_all() { # end job processes, slurmd, slurmctld, munged of this cluster (TERM, then KILL)
    local jobs daemons p i
    jobs=$(stepds | tr '\n' ' ')
    if [[ -n ${jobs// /} ]]; then
        # shellcheck disable=SC2086
        jobs="$jobs $(descendants $jobs | tr '\n' ' ')"
        # shellcheck disable=SC2086
        kill -9 $jobs 2>/dev/null || true
    fi
    daemons=$(our_daemons | tr '\n' ' ')
    [[ -n ${daemons// /} ]] || return 0
    # shellcheck disable=SC2086
    kill $daemons 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        local left=""
        for p in $daemons; do pid_alive "$p" && left+="$p "; done
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -9 $left 2>/dev/null || true
}

# -- config ----------------------------------------------------------------------------------
write_conf() { # write_conf N: slurm.conf, the task prolog, the node list
    local n=$1 d i
    d=$(state_dir)
    {
        echo "# Written by scripts/slurm-cluster.sh for the netns cluster '$PREFIX'; removed by 'down'."
        echo "ClusterName=$PREFIX"
        echo "SlurmctldHost=$(hostname -s)($SUBNET.254)"
        echo "SlurmctldPort=$PORT"
        echo "SlurmdPort=$((PORT + 1))"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$d/munge/munge.socket"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$d/ctld"
        echo "SlurmdSpoolDir=$d/spool/%n"
        echo "SlurmctldPidFile=$d/run/slurmctld.pid"
        echo "SlurmdPidFile=$d/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$d/log/slurmctld.log"
        echo "SlurmdLogFile=$d/log/slurmd-%n.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "TaskProlog=$d/task-prolog.sh"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "SwitchType=switch/none"
        echo "MpiDefault=none"
        echo "PlugStackConfig=$d/plugstack.conf"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/backfill"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SlurmdParameters=config_overrides"
        echo "SlurmdTimeout=10"
        echo "SlurmctldTimeout=10"
        echo "MessageTimeout=10"
        echo "KillWait=30"
        echo "InactiveLimit=0"
        echo "MailProg=/bin/true"
        echo "MinJobAge=600"
        echo "JobRequeue=0"
        for ((i = 1; i <= n; i++)); do
            echo "NodeName=$(node "$i") NodeAddr=$SUBNET.$i CPUs=$CPUS RealMemory=$MEMORY State=UNKNOWN"
        done
        echo "PartitionName=$PARTITION Nodes=${PREFIX}[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } >"$d/slurm.conf.tmp"
    mv "$d/slurm.conf.tmp" "$d/slurm.conf"
    : >"$d/plugstack.conf"
    # slurmd loads a cgroup plugin even when nothing uses it; its autodetection reads
    # /sys/fs/cgroup, which `ip netns exec` replaces with the node's fresh sysfs (nothing
    # mounted there). Naming the plugin skips the detection; with proctrack/linuxproc and
    # task/none it never touches a cgroup.
    echo "CgroupPlugin=cgroup/v1" >"$d/cgroup.conf"
    cat >"$d/task-prolog.sh" <<'EOF'
#!/bin/sh
# TaskProlog of scripts/slurm-cluster.sh: "export NAME=VALUE" lines set the task's environment.
# The nodes share one kernel: keep UCX and libfabric on TCP, as between separate machines.
[ -n "${UCX_TLS:-}" ] || echo "export UCX_TLS=tcp,self"
[ -n "${FI_PROVIDER:-}" ] || echo "export FI_PROVIDER=tcp"
EOF
    chmod 0755 "$d/task-prolog.sh"
    for ((i = 1; i <= n; i++)); do
        printf '%s %s.%d\n' "$(node "$i")" "$SUBNET" "$i"
    done >"$d/nodes"
}

# -- up --------------------------------------------------------------------------------------
sinfo_states() { # "node state" lines of the partition (state with its flag characters)
    SLURM_CONF=$(conf) timeout 10 sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null || true
}

all_idle() { # all_idle N: every node of the partition reports idle
    local states
    states=$(sinfo_states)
    [[ $(awk '$2 == "idle"' <<<"$states" | wc -l) -eq $1 ]]
}

healthy() { # healthy N: the cluster of this prefix is up and answering with N idle-or-busy nodes
    local d states p
    d=$(state_dir)
    [[ -r $d/slurm.conf && -r $d/nodes && $(wc -l <"$d/nodes") -eq $1 ]] || return 1
    for p in "$(read_pid "$d/run/slurmctld.pid")" "$(read_pid "$d/munge/munged.pid")"; do
        pid_alive "$p" || return 1
    done
    for p in $(node_names); do pid_alive "$(read_pid "$d/run/slurmd-$p.pid")" || return 1; done
    states=$(sinfo_states)
    [[ $(awk '$2 ~ /^(idle|mix|alloc|comp)$/' <<<"$states" | wc -l) -eq $1 ]]
}

log_hint() { # the last error line of a daemon's log, for a one-line message
    local f=$1
    [[ -r $f ]] || return 0
    # (a first start's missing state files, and PMIx where libpmix is not installed, are not it)
    grep -iE 'error|fatal' "$f" | grep -vE 'state save file|Could not open .* state file|pmix' |
        tail -1 | sed 's/^\[[^]]*\] //'
}

port_taken() { # port_taken PORT: something listens on it in the root namespace
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

start_daemons() { # start_daemons N: munged, slurmctld, one slurmd per node; wait for idle
    local n=$1 d i t
    d=$(state_dir)
    mkdir -p "$d" "$d/munge" "$d/run" "$d/log" "$d/spool" "$d/node-local"
    chmod 0755 "$d" "$d/munge" "$d/run" "$d/log" "$d/spool" "$d/node-local"
    mkdir -p "$d/ctld" && chmod 0700 "$d/ctld"
    mungekey -c -f -k "$d/munge/munge.key" >/dev/null 2>&1 ||
        { echo "mungekey could not create $d/munge/munge.key"; return 1; }
    chmod 0400 "$d/munge/munge.key"
    munged --socket="$d/munge/munge.socket" --key-file="$d/munge/munge.key" \
        --pid-file="$d/munge/munged.pid" --log-file="$d/log/munged.log" \
        --seed-file="$d/munge/munged.seed" >/dev/null 2>&1 ||
        { echo "munged would not start: $(log_hint "$d/log/munged.log")"; return 1; }
    munge -S "$d/munge/munge.socket" -n 2>/dev/null | unmunge -S "$d/munge/munge.socket" >/dev/null 2>&1 ||
        { echo "munge does not answer on $d/munge/munge.socket"; return 1; }
    slurmctld -f "$d/slurm.conf" >/dev/null 2>&1 ||
        { echo "slurmctld would not start: $(log_hint "$d/log/slurmctld.log")"; return 1; }
    for ((t = 0; t < 100; t++)); do
        SLURM_CONF=$d/slurm.conf timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break
        pid_alive "$(read_pid "$d/run/slurmctld.pid")" || [[ $t -lt 20 ]] ||
            { echo "slurmctld exited: $(log_hint "$d/log/slurmctld.log")"; return 1; }
        sleep 0.2
    done
    ((t < 100)) || { echo "slurmctld does not answer on port $PORT: $(log_hint "$d/log/slurmctld.log")"; return 1; }
    for ((i = 1; i <= n; i++)); do
        mkdir -p "$d/spool/$(node "$i")"
        # `ip netns exec` gives slurmd a mount namespace of its own (a slave of the root's): a
        # tmpfs mounted there is the node's local scratch, seen by its jobs only, and goes
        # when the node's last process ends.
        # shellcheck disable=SC2016  # the positional parameters expand in the node's shell
        ip netns exec "$(node "$i")" sh -c 'mount -t tmpfs -o size=256m,mode=1777 fg-node-local "$1" &&
            exec slurmd -f "$2" -N "$3"' sh "$d/node-local" "$d/slurm.conf" "$(node "$i")" >/dev/null 2>&1 ||
            { echo "slurmd of $(node "$i") would not start: $(log_hint "$d/log/slurmd-$(node "$i").log")"; return 1; }
    done
    for ((t = 0; t < IDLE_WAIT_S * 2; t++)); do
        all_idle "$n" && return 0
        sleep 0.5
    done
    local hint
    hint=$(log_hint "$d/log/slurmctld.log")
    echo "not every node became idle within $IDLE_WAIT_S s (sinfo: $(sinfo_states | tr '\n' ' ' | sed 's/ $//'))${hint:+: $hint}"
    return 1
}

netns_nodes() { # node count of the netns cluster of this prefix (0 when it is not up)
    [[ -r $NETNS_STATE/$PREFIX/nodes ]] && wc -l <"$NETNS_STATE/$PREFIX/nodes" || echo 0
}

link_etc_conf() { # point /etc/slurm/slurm.conf at this cluster's config when there is none
    if [[ ! -e $ETC_CONF && ! -L $ETC_CONF ]] && mkdir -p "$(dirname "$ETC_CONF")" 2>/dev/null &&
        ln -s "$(conf)" "$ETC_CONF" 2>/dev/null; then
        echo "$ETC_CONF" >"$(state_dir)/etc-link"
    fi
}

unlink_etc_conf() {
    [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$(conf)" ]] && rm -f "$ETC_CONF"
    return 0
}

teardown() { # everything of this prefix's Slurm cluster; the nodes too when it made them
    local made=0
    [[ -r $(state_dir)/made-nodes ]] && made=1
    stop_all
    unlink_etc_conf
    rm -rf "$(state_dir)"
    rmdir "$STATE_ROOT" 2>/dev/null || true # the last cluster's: the root goes too
    if ((made)); then
        bash "$NETNS_SH" down --prefix "$PREFIX" >/dev/null 2>&1 || true
    fi
}

cmd_up() {
    (($# >= 1)) || usage_error "up needs the node count N"
    local n=$1
    shift
    { [[ $n =~ ^[0-9]+$ ]] && ((10#$n >= 1 && 10#$n <= 253)); } ||
        usage_error "node count '$n' is not a whole number in 1..253"
    n=$((10#$n))
    parse_options "$@"
    need_root
    local have
    have=$(netns_nodes)
    if ((have != 0 && have != n)) && [[ ! -r $(state_dir)/made-nodes ]]; then
        die 2 "the netns cluster '$PREFIX' has $have node(s), not $n: use 'up $have', another --prefix, or take it down (netns-cluster.sh down --prefix $PREFIX)"
    fi
    if ((have == n)); then
        local sub
        sub=$(sed -n 's/^subnet=//p' "$NETNS_STATE/$PREFIX/link")
        [[ -z $SUBNET || $SUBNET == "$sub" ]] ||
            die 2 "--subnet $SUBNET: the netns cluster '$PREFIX' is up on $sub"
        SUBNET=$sub
    fi
    install_packages
    if ((have == n)) && healthy "$n"; then
        echo "$PROG: already up: $n node(s) $(node 1)..$(node "$n") idle in partition $PARTITION; SLURM_CONF=$(conf)"
        return 0
    fi
    local made=0
    [[ -r $(state_dir)/made-nodes ]] && made=1
    if [[ -d $(state_dir) ]]; then # a broken or different cluster of this prefix: start afresh
        if [[ -r $(conf) ]]; then  # with its settings, where not given now
            ((SEEN_PORT)) || PORT=$(sed -n 's/^SlurmctldPort=//p' "$(conf)")
            ((SEEN_PARTITION)) || PARTITION=$(sed -n 's/^PartitionName=\([^ ]*\).*/\1/p' "$(conf)")
            [[ -n $CPUS ]] || CPUS=$(sed -n 's/^NodeName=.* CPUs=\([0-9]*\).*/\1/p' "$(conf)" | head -1)
        fi
        stop_all
    fi
    if port_taken "$PORT" || port_taken "$((PORT + 1))"; then
        die 2 "--port $PORT: port $PORT or $((PORT + 1)) is already in use here; pick another with --port"
    fi
    if [[ -d $(state_dir) ]]; then
        unlink_etc_conf
        rm -rf "$(state_dir)"
    fi
    if ((have != n)) || ((made)); then
        local out
        SUBNET=${SUBNET:-10.77.0}
        [[ -r $NETNS_STATE/$PREFIX/nodes ]] || made=1
        local nrc=0
        out=$(bash "$NETNS_SH" up "$n" --prefix "$PREFIX" --subnet "$SUBNET" --rate "$RATE" 2>&1) || nrc=$?
        if ((nrc != 0)); then
            echo "$out" | grep -v '^\s*$' | tail -1 | sed 's/^netns-cluster: error: /'"$PROG"': error: nodes: /' >&2
            exit $((nrc == 2 ? 2 : 1))
        fi
    fi
    CPUS=${CPUS:-$(nproc)}
    MEMORY=${MEMORY:-$(awk -v n="$n" '/^MemTotal:/ { printf "%d", $2 / 1024 / n }' /proc/meminfo)}
    local err rc=0
    mkdir -p "$(state_dir)" && chmod 0755 "$STATE_ROOT" "$(state_dir)"
    ((made)) && : >"$(state_dir)/made-nodes"
    write_conf "$n"
    err=$(start_daemons "$n" 2>&1) || rc=$?
    if ((rc != 0)); then
        [[ -n ${SLURM_CLUSTER_KEEP_FAILED:-} ]] || teardown >/dev/null 2>&1 || true
        die 1 "up failed: $(echo "$err" | grep -v '^\s*$' | tail -1 | tr -s ' '); rolled back (nothing left)"
    fi
    link_etc_conf
    local where
    where="SLURM_CONF=$(conf)"
    [[ -r $(state_dir)/etc-link ]] && where+=" (also linked at $ETC_CONF)"
    echo "$PROG: $n node(s) up: $(node 1)..$(node "$n") at $SUBNET.1..$SUBNET.$n, $CPUS CPUs and $MEMORY MB each, idle in partition $PARTITION; controller $(hostname -s) at $SUBNET.254:$PORT; $where"
}

cmd_status() {
    parse_options "$@"
    local d
    d=$(state_dir)
    [[ -r $d/slurm.conf ]] || { echo "$PROG: no Slurm cluster with prefix $PREFIX"; return 0; }
    echo "config $d/slurm.conf"
    echo "slurmctld pid $(read_pid "$d/run/slurmctld.pid"), munged pid $(read_pid "$d/munge/munged.pid")"
    SLURM_CONF=$d/slurm.conf timeout 10 sinfo -N -o '%N %t %c %m %P' 2>&1 || true
    SLURM_CONF=$d/slurm.conf timeout 10 squeue 2>&1 || true
}

cmd_down() {
    parse_options "$@"
    need_root
    teardown
    echo "$PROG: $PREFIX Slurm cluster down"
}

main() {
    (($# >= 1)) || usage_error "no command"
    local cmd=$1
    shift
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) cmd_status "$@" ;;
        env)
            parse_options "$@"
            [[ -r $(conf) ]] || die 2 "no Slurm cluster with prefix $PREFIX (slurm-cluster.sh up N --prefix $PREFIX)"
            echo "export SLURM_CONF=$(conf)"
            ;;
        install)
            (($# == 0)) || usage_error "install takes no arguments"
            need_root
            install_packages
            echo "$PROG: slurmctld, slurmd, the Slurm clients and munge are installed"
            ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
        *) usage_error "unknown command '$cmd'" ;;
    esac
}

main "$@"
