#!/bin/bash
# slurm/ci-setup.sh: make this machine able to run logcapture's end-to-end tests on real Slurm.
# Idempotent; run as root (CI's .ci/run calls it before pytest). It:
#   1. installs Debian's Slurm 22.05 and munge (slurm-wlm's job_submit/lua plugin is in
#      slurm-wlm-basic-plugins; lua5.1 only lets tests check job_submit.lua's logic), and gcc,
#      make and libslurm-dev (spank.h) to build the task plugin in slurm/spank; and, for the MPI
#      end-to-end test only, Debian's Open MPI (openmpi-bin, whose libopenmpi3 is built against
#      the system PMIx), mpi4py for the system python3 (a hello world needs no compiler or MPI
#      headers) and libpmix-dev: Slurm's mpi/pmix plugin dlopens pmix2/lib/libpmix.so, the
#      unversioned name only that package ships (without it `srun --mpi=pmix` fails with "can
#      not load PMIx library"). Open MPI rather than MPICH: it is Debian's default MPI (the one
#      python3-mpi4py uses), and libmpich12 alone is 40 MB. Open MPI as Debian builds it
#      talks PMIx only, so `srun --mpi=pmi2` does not start it;
#   2. creates the test users lcuser1 and lcuser2 (homes under /home);
#   3. makes the checkout's Python runnable by those users: a venv whose interpreter lives under
#      a directory others cannot search (pyenv under /root) gets the search bit (o+x, not read)
#      on that directory, or jobs of test users could not start the wrapper.
# Services are not started here: slurm/dev-cluster up starts munge, slurmctld and slurmd.
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
REPO=$(dirname "$HERE")
TEST_USERS=${LOGCAPTURE_DEV_USERS:-lcuser1 lcuser2}
PACKAGES="slurm-wlm slurmctld slurmd slurm-client munge lua5.1 libslurm-dev gcc make
          openmpi-bin python3-mpi4py libpmix-dev"

[ "$(id -u)" = 0 ] || { echo "ci-setup: must run as root" >&2; exit 1; }

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "ci-setup: installing$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# Debian's munge package makes /etc/munge/munge.key; make one if it is missing.
if [ ! -s /etc/munge/munge.key ]; then
    /usr/sbin/mungekey --create --force 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi

for u in $TEST_USERS; do
    if ! id "$u" >/dev/null 2>&1; then
        useradd --create-home --home-dir "/home/$u" --shell /bin/bash "$u"
    fi
done

# Every directory on the way to the venv's real interpreter must be searchable by others.
py="$REPO/.venv/bin/python3"
if [ -e "$py" ]; then
    real=$(readlink -f "$py")
    d=$(dirname "$real")
    while [ "$d" != / ]; do
        perms=$(stat -c %A "$d")
        if [ "${perms:9:1}" != x ] && [ "${perms:9:1}" != t ]; then
            echo "ci-setup: chmod o+x $d (so test users can run $real)" >&2
            chmod o+x "$d"
        fi
        d=$(dirname "$d")
    done
    # And to the checkout itself.
    d="$REPO"
    while [ "$d" != / ]; do
        perms=$(stat -c %A "$d")
        [ "${perms:9:1}" = x ] || [ "${perms:9:1}" = t ] || chmod o+x "$d"
        d=$(dirname "$d")
    done
    u=${TEST_USERS%% *}
    if ! setpriv --reuid="$u" --regid="$u" --init-groups "$py" -I -c 'import logcapture' 2>/dev/null; then
        echo "ci-setup: warning: $u cannot import logcapture with $py" >&2
    fi
fi
echo "ci-setup: ready (slurm $(dpkg-query -W -f='${Version}' slurmctld), users: $TEST_USERS)" >&2
