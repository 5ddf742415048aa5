# Helpers for the gate's ecosystem checks (sourced by .ci/run and the
# scripts beside it). Everything a check needs is installed here, from the
# package registries only: Debian packages by apt-get, Python tools into a
# virtualenv under target/ (never the machine's own Python).

CI_VENV="${CI_VENV:-$(pwd)/target/ci-venv}"

# ci_apt PACKAGE... : install the Debian packages not installed yet.
ci_apt() {
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# ci_pip REQUIREMENT... : install into the gate's virtualenv; its bin/ goes
# first on PATH.
ci_pip() {
  [ -x "$CI_VENV/bin/python" ] || python3 -m venv "$CI_VENV"
  "$CI_VENV/bin/pip" install -q --disable-pip-version-check "$@"
  export PATH="$CI_VENV/bin:$PATH"
}
