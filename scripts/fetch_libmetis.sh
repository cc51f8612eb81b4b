#!/usr/bin/env bash
# Put Debian's libmetis5 (METIS 5 with 32-bit indices) into DEST (default .venv/lib), no root
# needed: `apt-get download` + `dpkg-deb -x`. `fullgraph partition` then uses it instead of
# pymetis' 64-bit METIS (half the partitioning memory). Best effort: without apt, or offline,
# it says so and exits 0, and pymetis is used.
set -u
dest="${1:-.venv/lib}"
if ls "$dest"/libmetis.so* >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "libmetis: no apt-get/dpkg-deb here; partitioning uses pymetis (64-bit, more memory)"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if (cd "$tmp" && apt-get download -q libmetis5 >/dev/null 2>&1) \
    && dpkg-deb -x "$tmp"/libmetis5_*.deb "$tmp/x" \
    && cp -P "$tmp"/x/usr/lib/*/libmetis.so* "$dest"/; then
    echo "libmetis: $(ls "$tmp"/libmetis5_*.deb | xargs -n1 basename) unpacked into $dest"
else
    echo "libmetis: could not fetch Debian's libmetis5; partitioning uses pymetis (64-bit, more memory)"
fi
exit 0
