#!/bin/sh
# The package lane's guest (xtask/src/package_lane.rs): Debian 12 booted
# with systemd, the packages in /srv/lane. Installs, configures, reloads,
# breaks the file, upgrades, removes and purges xdp-limiter as an operator
# would, checking after each step that the interface is protected as it
# should be. Prints `LANE STEP name`, then `LANE PASS name` or
# `LANE FAIL name: why`; `LANE DONE` last; then powers off.
#
# A restarted daemon adopts the pinned link and replaces the program
# through it atomically (a new program id, never a moment without one),
# so protection across a restart or an upgrade is checked by a flood
# running through it, not by the id.
set -u

LANE=/srv/lane
IF=xl0
HOST=10.9.0.1
CONFIG=/etc/xdp-limiter/config.toml
STEP=boot

say() { echo "LANE $*"; }
step() {
	STEP=$1
	say "STEP $STEP"
}
pass() { say "PASS $STEP"; }
finish() {
	say DONE
	sync
	echo o >/proc/sysrq-trigger
	sleep 60
}
fail() {
	say "FAIL $STEP: $*"
	systemctl status xdp-limiter --no-pager 2>&1 | tail -n 20
	journalctl -u xdp-limiter --no-pager -n 40 2>&1
	finish
}
check() {
	what=$1
	shift
	"$@" || fail "$what"
}

# The id of the XDP program on the interface (empty when none is).
prog_id() { ip link show dev "$IF" | sed -n 's/.*prog\/xdp id \([0-9]*\).*/\1/p'; }
# Per cent of a flood ping from the peer's namespace that got no answer.
loss() {
	ip netns exec peer ping -q -f -c "$1" -W 1 "$HOST" 2>&1 |
		sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p' | cut -d. -f1
}
# Limited: at 4 or 6 pps with a burst of 10, a flood of 300 pings (about
# 55 a second under TCG here: 6 s, 46 let through at 6 pps) loses more
# than half even at 20 a second (15 s, 100 through); open: a flood of 100
# loses at most a few.
limited() {
	l=$(loss 300)
	echo "flood: ${l:-?}% lost"
	[ "${l:-0}" -ge 50 ]
}
open() {
	l=$(loss 100)
	echo "flood: ${l:-?}% lost"
	[ "${l:-100}" -le 5 ]
}
active() { [ "$(systemctl is-active xdp-limiter)" = active ]; }
main_pid() { systemctl show -p MainPID --value xdp-limiter; }
default_pps() { xdp-limiter rule ls --output json | jq -r .default.pps; }
# Waits up to 30 s for the daemon's default rule to be $1 pps.
wait_pps() {
	for _ in $(seq 30); do
		[ "$(default_pps 2>/dev/null)" = "$1" ] && return 0
		sleep 1
	done
	return 1
}
write_config() {
	cat >"$CONFIG" <<EOF
# The lane's configuration: the operator's edit of the conffile.
[daemon]
interfaces = ["$IF"]

[default]
pps = $1
burst_packets = 10
window = "1s"
dry_run = false
EOF
}

say "BOOTED $(uname -r) under $(cat /proc/1/comm)"

step network
modprobe veth || fail "modprobe veth"
ip netns add peer
ip link add "$IF" type veth peer name xl1 netns peer
ip addr add "$HOST/24" dev "$IF"
ip link set "$IF" up
ip -n peer addr add 10.9.0.2/24 dev xl1
ip -n peer link set xl1 up
ip -n peer link set lo up
check "the pair answers before any install" open
pass

step install
check "apt install" apt-get install -y "$LANE"/xdp-limiter_*-1_amd64.deb
check "installed" dpkg-query -W -f='${Status}' xdp-limiter
check "installed disabled" test "$(systemctl is-enabled xdp-limiter)" = disabled
check "not started" test "$(systemctl is-active xdp-limiter)" != active
check "the conffile" test -f "$CONFIG"
check "the man page" test -f /usr/share/man/man8/xdp-limiter.8.gz
check "the unit's documentation" test -f /usr/share/doc/xdp-limiter/operations.md
check "nothing attached yet" test -z "$(prog_id)"
pass

step enable
write_config 4
check "enable --now" systemctl enable --now xdp-limiter
check "active once ready" active
PROG=$(prog_id)
check "a program on $IF" test -n "$PROG"
check "the flood limited" limited
check "status answers" xdp-limiter status
# The journal holds the event with its fields.
journal_event() {
	journalctl -u xdp-limiter -o json --no-pager |
		jq -s -r 'map(select(.EVENT == "source_limited"))[0] | "\(.SOURCE) \(.RULE) \(.LEVEL) \(.ACTION)"'
}
check "source_limited in the journal with its fields" \
	test "$(journal_event)" = "10.9.0.2 default source drop"
pass

step reload
PID=$(main_pid)
write_config 6
check "systemctl reload" systemctl reload xdp-limiter
check "the new limit applied" wait_pps 6
check "the same daemon" test "$(main_pid)" = "$PID"
check "still limited" limited
pass

step bad-reload
cp "$CONFIG" /root/good.toml
echo 'pps = "lots"' >>"$CONFIG"
if systemctl reload xdp-limiter; then fail "a bad file reloaded"; fi
check "the daemon said why" sh -c \
	'journalctl -u xdp-limiter --no-pager | grep -q "configuration rejected"' 
check "the daemon still runs" active
check "the old limit kept" test "$(default_pps)" = 6
check "still limited" limited
pass

step bad-restart
if systemctl restart xdp-limiter; then fail "a bad file started"; fi
check "ExecStartPre refused it" sh -c \
	'systemctl status xdp-limiter --no-pager | grep -q "ExecStartPre=.*status=1/FAILURE"'
check "and named the fault" sh -c \
	'journalctl -u xdp-limiter --no-pager | grep -q "error: configuration $0.*duplicate key" ' "$CONFIG"
check "the program left attached" test "$(prog_id)" = "$PROG"
check "still limited, no daemon" limited
pass

step fixed
cp /root/good.toml "$CONFIG"
systemctl reset-failed xdp-limiter
check "start" systemctl start xdp-limiter
check "active" active
# Adoption replaces the program through the pinned link, atomically.
PROG=$(prog_id)
check "a program on $IF" test -n "$PROG"
check "the limit from the file" test "$(default_pps)" = 6
check "limited" limited
pass

step upgrade
PID=$(main_pid)
ip netns exec peer ping -q -f -c 3000 -W 1 "$HOST" >/root/upgrade-flood 2>&1 &
FLOOD=$!
check "apt install of the newer build" apt-get install -y "$LANE"/xdp-limiter_*-2_amd64.deb
wait "$FLOOD"
cat /root/upgrade-flood
l=$(sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p' /root/upgrade-flood | cut -d. -f1)
check "the flood limited through the upgrade" test "${l:-0}" -ge 50
check "the new version" test "$(dpkg-query -W -f='${Version}' xdp-limiter)" = "$(
	ls "$LANE"/xdp-limiter_*-2_amd64.deb | sed 's/.*xdp-limiter_\(.*\)_amd64.deb/\1/'
)"
check "active" active
check "restarted" test "$(main_pid)" != "$PID"
PROG=$(prog_id)
check "a program on $IF" test -n "$PROG"
check "the operator's file kept" cmp "$CONFIG" /root/good.toml
check "still enabled" test "$(systemctl is-enabled xdp-limiter)" = enabled
pass

step remove
check "apt remove" apt-get remove -y xdp-limiter
check "stopped" test "$(systemctl is-active xdp-limiter)" != active
check "the binary gone" test ! -e /usr/sbin/xdp-limiter
check "the configuration kept" test -f "$CONFIG"
check "the program left attached" test "$(prog_id)" = "$PROG"
check "still limited" limited
pass

step purge
check "apt purge" apt-get purge -y xdp-limiter
check "the configuration gone" test ! -e /etc/xdp-limiter
check "the program detached" test -z "$(prog_id)"
check "the pins gone" test ! -e /sys/fs/bpf/xdp-limiter
check "the flood passes" open
pass

finish
