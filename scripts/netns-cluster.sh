#!/usr/bin/env bash
# A cluster on one machine: N network namespaces as nodes, each joined to one bridge in the root
# namespace by a veth pair whose two ends are shaped (tbf rate both ways; netem delay and loss on
# the node's outgoing side), so that processes started with `ip netns exec NODE` talk over real
# TCP/IP links of a chosen bandwidth and latency. The launcher in the root namespace reaches every
# node through the bridge (address .254).
#
# Usage:
#   netns-cluster.sh up N [--rate 10gbit] [--delay 100us] [--loss 0%] [--prefix fgn]
#                         [--subnet 10.77.0]
#   netns-cluster.sh shape NODE [--rate R] [--delay D] [--loss L]   (change one node's link)
#   netns-cluster.sh status [--prefix fgn]
#   netns-cluster.sh down [--prefix fgn]
#
# Nodes are PREFIX1..PREFIXN (namespace names = host names), at SUBNET.1..SUBNET.N/24; their names
# go into /etc/hosts (lines marked `# netns-cluster:PREFIX`) so that the root namespace and every
# node resolve them. State: /run/netns-cluster/PREFIX/ (nodes, hostfile for mpirun). `up` is
# idempotent (a second `up` re-applies addresses and shaping, adds missing nodes, removes extra
# ones); `down` removes everything `up` made. A failed `up` rolls back (nothing half-built).
# --delay is each node's one-way latency onto the bridge (node to node: delay(A) on the way out;
# a round trip between two nodes at the same delay is 2 x delay); --rate caps each direction.
#
# Exit status: 0 done; 1 this machine cannot (not root, no iproute2, kernel refuses namespaces);
# 2 bad input (one line, nothing changed).
set -uo pipefail

PROG=netns-cluster
STATE_ROOT=${NETNS_CLUSTER_STATE:-/run/netns-cluster}
HOSTS_FILE=${NETNS_CLUSTER_HOSTS:-/etc/hosts}

die() { # die CODE MESSAGE: one line on stderr, exit CODE
    echo "$PROG: error: $2" >&2
    exit "$1"
}

usage_error() { die 2 "$1 (see $PROG --help)"; }

# -- validation (no side effects) -------------------------------------------------------------

# rate_bits RATE: bits per second of a tc rate (tc's units: bit kbit mbit gbit tbit, bps kbps
# mbps gbps tbps, IEC kibit..., bare number = bits); empty output when tc could not parse it.
rate_bits() {
    local r=${1,,} num unit mult
    [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?i?)(bit|bps)?$ ]] || return 0
    num=${BASH_REMATCH[1]} unit=${BASH_REMATCH[3]} mult=1
    [[ -z ${BASH_REMATCH[4]} && -n $unit ]] && return 0 # "10g" is not a tc rate
    case $unit in
        "") mult=1 ;; k) mult=1e3 ;; m) mult=1e6 ;; g) mult=1e9 ;; t) mult=1e12 ;;
        ki) mult=1024 ;; mi) mult=1048576 ;; gi) mult=1073741824 ;; ti) mult=1099511627776 ;;
        *) return 0 ;;
    esac
    [[ ${BASH_REMATCH[4]} == bps ]] && mult="$mult*8"
    awk -v n="$num" "BEGIN { v = n * $mult; if (v >= 8000) printf \"%.0f\", v }"
}

check_time() { # check_time OPTION VALUE: a tc time (us, usec, ms, msec, s, sec; bare = us)
    [[ ${2,,} =~ ^[0-9]+(\.[0-9]+)?(us|usec|ms|msec|s|sec|secs)?$ ]] ||
        usage_error "$1 $2: not a time tc understands (e.g. 100us, 2ms)"
}

check_loss() {
    [[ $1 =~ ^[0-9]+(\.[0-9]+)?%?$ ]] && awk -v l="${1%\%}" 'BEGIN { exit !(l >= 0 && l <= 100) }' ||
        usage_error "--loss $1: not a percentage in [0, 100] (e.g. 5%)"
}

check_prefix() {
    [[ $1 =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
        usage_error "--prefix $1: use 1-8 lower-case letters and digits, starting with a letter"
}

need_tools() {
    local t
    for t in ip tc awk; do
        command -v "$t" >/dev/null 2>&1 ||
            die 1 "'$t' not found: install iproute2 (apt-get install iproute2)"
    done
    [[ $(id -u) -eq 0 ]] ||
        die 1 "needs root (network namespaces, veth pairs and tc need CAP_NET_ADMIN); run it with sudo"
}

# -- pieces ----------------------------------------------------------------------------------
RATE=10gbit DELAY=0 LOSS=0% PREFIX=fgn SUBNET=10.77.0

parse_link_options() { # sets RATE DELAY LOSS PREFIX SUBNET and SEEN_* from "$@"
    while (($#)); do
        case $1 in
            --rate | --delay | --loss | --prefix | --subnet)
                (($# >= 2)) || usage_error "$1 needs a value"
                case $1 in
                    --rate) RATE=$2 SEEN_RATE=1 ;;
                    --delay) DELAY=$2 SEEN_DELAY=1 ;;
                    --loss) LOSS=$2 SEEN_LOSS=1 ;;
                    --prefix) PREFIX=$2 ;;
                    --subnet) SUBNET=$2 ;;
                esac
                shift 2
                ;;
            *) usage_error "unknown argument '$1'" ;;
        esac
    done
    [[ -n $(rate_bits "$RATE") ]] || usage_error "--rate $RATE: not a rate tc understands (e.g. 1gbit, 10gbit, 500mbit; at least 1kbps)"
    check_time --delay "$DELAY"
    check_loss "$LOSS"
    check_prefix "$PREFIX"
    [[ $SUBNET =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] &&
        ((BASH_REMATCH[1] < 256 && BASH_REMATCH[2] < 256 && BASH_REMATCH[3] < 256)) ||
        usage_error "--subnet $SUBNET: give the first three octets of a /24, e.g. 10.77.0"
}

bridge() { echo "${PREFIX}br"; }
node() { echo "$PREFIX$1"; }
host_end() { echo "$PREFIX$1h"; }
state_dir() { echo "$STATE_ROOT/$PREFIX"; }

is_zero() { [[ ${1,,} =~ ^0+(\.0+)?[a-z%]*$ ]]; }

warn() { echo "$PROG: warning: $1" >&"${WARN_FD:-2}"; }

# loss_filter DEV PERCENT [NS...]: drop PERCENT of DEV's outgoing packets at random without netem:
# a classic-BPF filter in direct-action mode on the clsact egress hook (load the kernel's random
# number, return TC_ACT_SHOT below the threshold, TC_ACT_OK otherwise).
loss_filter() {
    local dev=$1 pct=${2%\%} threshold
    shift 2
    threshold=$(awk -v p="$pct" 'BEGIN { printf "%.0f", p / 100 * 4294967296 }')
    "$@" tc qdisc add dev "$dev" clsact || return 1
    "$@" tc filter add dev "$dev" egress bpf da \
        bytecode "4,32 0 0 4294963256,53 0 1 $threshold,6 0 0 0,6 0 0 2"
}

# shape DEV RATE [DELAY LOSS]: tbf at RATE (burst 2 ms of traffic, >= 128 KiB so that a 64 KiB
# GSO packet passes whole), with a netem child adding DELAY and LOSS when given. A kernel without
# netem (CONFIG_NET_SCH_NETEM unset) still gets LOSS (loss_filter); DELAY is then not applied and
# a warning says so.
shape() {
    local dev=$1 rate=$2 delay=${3:-0} loss=${4:-0} bits burst ns=() err
    [[ -n ${NS:-} ]] && ns=(ip netns exec "$NS")
    bits=$(rate_bits "$rate")
    burst=$(awk -v b="$bits" 'BEGIN { v = b / 8 * 0.002; if (v < 131072) v = 131072; printf "%.0f", v }')
    "${ns[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
    "${ns[@]}" tc qdisc del dev "$dev" clsact 2>/dev/null || true
    "${ns[@]}" tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 50ms ||
        return 1
    is_zero "$delay" && is_zero "$loss" && return 0
    local args=(delay "$delay" limit 100000)
    is_zero "$loss" || args+=(loss "${loss%\%}%")
    err=$("${ns[@]}" tc qdisc add dev "$dev" parent 1:1 handle 10: netem "${args[@]}" 2>&1) && return 0
    [[ $err == *"qdisc kind is unknown"* ]] || { echo "$err" >&2; return 1; }
    if ! is_zero "$loss"; then loss_filter "$dev" "$loss" "${ns[@]}" || return 1; fi
    if ! is_zero "$delay" && [[ -z ${NETEM_WARNED:-} ]]; then
        warn "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): --delay $delay is not applied (rate and loss are)"
        NETEM_WARNED=1
    fi
}

hosts_remove() { # drop this cluster's lines from the hosts file (in place: it may be a mount)
    local tmp
    grep -q "# netns-cluster:$PREFIX\$" "$HOSTS_FILE" 2>/dev/null || return 0
    tmp=$(mktemp) || return 1
    grep -v "# netns-cluster:$PREFIX\$" "$HOSTS_FILE" >"$tmp"
    cat "$tmp" >"$HOSTS_FILE"
    rm -f "$tmp"
}

hosts_add() { # hosts_add N: one line per node
    local i tmp
    hosts_remove || return 1
    tmp=$(mktemp) || return 1
    printf '%s.254\t%s # netns-cluster:%s\n' "$SUBNET" "$(node 0)" "$PREFIX" >"$tmp"
    for ((i = 1; i <= $1; i++)); do
        printf '%s.%d\t%s # netns-cluster:%s\n' "$SUBNET" "$i" "$(node "$i")" "$PREFIX"
    done >>"$tmp"
    cat "$tmp" >>"$HOSTS_FILE"
    rm -f "$tmp"
}

existing_nodes() { # node indices of this prefix that exist now (namespaces or host ends)
    {
        ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX\([0-9]\+\)\$/\1/p"
        ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed -n "s/^$PREFIX\([0-9]\+\)h\(@.*\)\?\$/\1/p"
    } | sort -nu
}

remove_node() { # remove_node I: its namespace (takes the node end with it) and its host end
    ip link del "$(host_end "$1")" 2>/dev/null || true
    if ip netns list | awk '{print $1}' | grep -qx "$(node "$1")"; then
        # End whatever still runs inside, so that no process is left in a dead namespace.
        local pids
        pids=$(ip netns pids "$(node "$1")" 2>/dev/null)
        [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
        ip netns del "$(node "$1")" || return 1
    fi
}

add_node() { # add_node I: namespace, veth pair, address, shaping (idempotent)
    local i=$1 n h
    n=$(node "$i") h=$(host_end "$i")
    ip netns list | awk '{print $1}' | grep -qx "$n" || ip netns add "$n" || return 1
    ip netns exec "$n" ip link set lo up || return 1
    if ! ip link show "$h" >/dev/null 2>&1; then
        ip netns exec "$n" ip link del eth0 2>/dev/null || true
        ip link add "$h" type veth peer name "${h%h}n" || return 1
        ip link set "${h%h}n" netns "$n" || return 1
        ip netns exec "$n" ip link set "${h%h}n" name eth0 || return 1
    fi
    ip link set "$h" master "$(bridge)" up || return 1
    ip netns exec "$n" ip addr flush dev eth0 || return 1
    ip netns exec "$n" ip addr add "$SUBNET.$i/24" dev eth0 || return 1
    ip netns exec "$n" ip link set eth0 up || return 1
    NS="" shape "$h" "$RATE" || return 1
    NS=$n shape eth0 "$RATE" "$DELAY" "$LOSS" || return 1
}

write_state() { # write_state N
    local d i
    d=$(state_dir)
    mkdir -p "$d" || return 1
    : >"$d/nodes.tmp" && : >"$d/hostfile.tmp"
    for ((i = 1; i <= $1; i++)); do
        printf '%s %s.%d\n' "$(node "$i")" "$SUBNET" "$i" >>"$d/nodes.tmp"
        node "$i" >>"$d/hostfile.tmp"
    done
    printf 'rate=%s\ndelay=%s\nloss=%s\nsubnet=%s\nbridge=%s\n' "$RATE" "$DELAY" "$LOSS" \
        "$SUBNET" "$(bridge)" >"$d/link.tmp"
    mv "$d/nodes.tmp" "$d/nodes" && mv "$d/hostfile.tmp" "$d/hostfile" && mv "$d/link.tmp" "$d/link"
}

do_down() {
    local i
    for i in $(existing_nodes); do remove_node "$i"; done
    ip link del "$(bridge)" 2>/dev/null || true
    hosts_remove
    rm -rf "$(state_dir)"
}

subnet_taken() { # prints the device already routing SUBNET.0/24 in the root namespace, if not ours
    ip -o route show "$SUBNET.0/24" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") print $(i + 1)}' |
        grep -vx "$(bridge)" | head -1
}

cmd_up() {
    (($# >= 1)) || usage_error "up needs the node count N"
    local n=$1
    shift
    [[ $n =~ ^[0-9]+$ ]] && ((10#$n >= 1 && 10#$n <= 253)) ||
        usage_error "node count '$n' is not a whole number in 1..253"
    n=$((10#$n))
    parse_link_options "$@"
    need_tools
    local taken
    taken=$(subnet_taken)
    [[ -z $taken ]] && [[ $(ip -o -4 addr show 2>/dev/null | awk -v s="$SUBNET." '$4 ~ "^" s {print $2}' | grep -vx "$(bridge)" | head -1) == "" ]] ||
        die 2 "subnet $SUBNET.0/24 is already in use by device ${taken:-another interface}; pick another with --subnet"
    local err
    exec 3>&2
    err=$(
        WARN_FD=3
        set -e
        exec 2>&1
        mkdir -p /run/netns
        if ! ip link show "$(bridge)" >/dev/null 2>&1; then
            ip link add "$(bridge)" type bridge
        fi
        ip addr flush dev "$(bridge)"
        ip addr add "$SUBNET.254/24" dev "$(bridge)"
        ip link set "$(bridge)" up
        for ((i = 1; i <= n; i++)); do add_node "$i"; done
        for i in $(existing_nodes); do ((i <= n)) || remove_node "$i"; done
        hosts_add "$n"
        write_state "$n"
    )
    local rc=$?
    if ((rc != 0)); then
        do_down >/dev/null 2>&1
        local why
        why=$(echo "$err" | grep -v '^\s*$' | tail -1)
        if [[ $why == *"Operation not permitted"* || $why == *"Permission denied"* ]]; then
            die 1 "cannot create network namespaces here (${why}); rolled back"
        fi
        die 1 "up failed: ${why:-unknown error}; rolled back (nothing left)"
    fi
    echo "$PROG: $n node(s) up: $(node 1)..$(node "$n") at $SUBNET.1..$SUBNET.$n, bridge $(bridge) $SUBNET.254, rate $RATE, delay $DELAY, loss $LOSS; mpirun host file $(state_dir)/hostfile"
}

cmd_shape() {
    (($# >= 1)) || usage_error "shape needs a node name"
    local name=$1 i
    shift
    SEEN_RATE=0 SEEN_DELAY=0 SEEN_LOSS=0
    local d p
    # The node's prefix: the state directory whose nodes file names it.
    for d in "$STATE_ROOT"/*/; do
        [[ -f $d/nodes ]] && grep -q "^$name " "$d/nodes" && p=$(basename "$d")
    done
    [[ -n ${p:-} ]] || usage_error "unknown node '$name' (not in any cluster under $STATE_ROOT)"
    PREFIX=$p
    # shellcheck disable=SC1091
    source <(sed -n 's/^\(rate\|delay\|loss\)=/\U\1=/p' "$(state_dir)/link")
    parse_link_options "$@" --prefix "$p"
    need_tools
    i=${name#"$PREFIX"}
    local err
    exec 3>&2
    err=$( (WARN_FD=3 && NS="" shape "$(host_end "$i")" "$RATE" && NS=$name shape eth0 "$RATE" "$DELAY" "$LOSS") 2>&1) ||
        die 1 "shape $name failed: $(echo "$err" | tail -1)"
    echo "$PROG: $name: rate $RATE, delay $DELAY, loss $LOSS"
}

cmd_status() {
    parse_link_options "$@"
    local i any=0
    for i in $(existing_nodes); do
        any=1
        local n h
        n=$(node "$i") h=$(host_end "$i")
        printf '%s %s link %s qdisc %s\n' "$n" \
            "$(ip netns exec "$n" ip -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}')" \
            "$(ip -o link show "$h" 2>/dev/null | grep -q 'state UP\|LOWER_UP' && echo up || echo down)" \
            "$(ip netns exec "$n" tc qdisc show dev eth0 2>/dev/null | tr '\n' ';' | tr -s ' ')"
    done
    ((any)) || echo "$PROG: no nodes with prefix $PREFIX"
}

main() {
    (($# >= 1)) || usage_error "no command"
    local cmd=$1
    shift
    case $cmd in
        up) cmd_up "$@" ;;
        down)
            parse_link_options "$@"
            need_tools
            do_down
            echo "$PROG: $PREFIX cluster down"
            ;;
        status)
            need_tools
            cmd_status "$@"
            ;;
        shape) cmd_shape "$@" ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
        *) usage_error "unknown command '$cmd'" ;;
    esac
}

main "$@"
