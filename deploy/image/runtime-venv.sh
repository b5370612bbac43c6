# Run by the Dockerfile's venv stages: one venv at /opt/fleet, without pip or setuptools of its
# own, for the wheels named as arguments. The build venv's pip resolves them against the lock's
# versions (a dry run), then installs exactly those from the lock with hash checking, then the
# wheels themselves.
set -eu
. ./pip-cert.sh
python3 -m venv --without-pip /opt/fleet
pip="/opt/build/bin/pip --python /opt/fleet/bin/python"
$pip install --quiet --dry-run --ignore-installed --report /tmp/report.json -c /tmp/pins.txt "$@"
python3 lockpick.py requirements.lock --report /tmp/report.json > /tmp/runtime.txt
$pip install --quiet --require-hashes --no-deps -r /tmp/runtime.txt
$pip install --quiet --no-deps --no-index "$@"
rm -rf /tmp/pip-cache
