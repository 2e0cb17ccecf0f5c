# Sourced by vm/fetch-kernel.sh and vm/fetch-nbd-client.sh: apt through a private sources
# list and state in vm/cache/, so that the machine's own apt configuration is left alone and
# nothing is installed here (packages are only downloaded, then unpacked with dpkg-deb).
#
#   private_apt DIR "deb URL SUITE COMPONENT" WHO
#
# prepares DIR (lists, archives, and DIR/deb for downloads), sets the array `apt_opts` for
# `apt-get`/`apt-cache` calls, and runs `apt-get update` with it.
private_apt() {
  local dir="$1" source="$2" who="$3"
  mkdir -p "$dir/lists/partial" "$dir/archives/partial" "$dir/deb"
  echo "$source" >"$dir/sources.list"
  apt_opts=(
    -o "Dir::Etc::sourcelist=$dir/sources.list"
    -o "Dir::Etc::sourceparts=/nonexistent"
    -o "Dir::State::Lists=$dir/lists"
    -o "Dir::Cache=$dir"
    -o "Dir::State::status=/dev/null"
    -o "APT::Get::List-Cleanup=0"
    -o "APT::Sandbox::User=root"
  )
  echo "$who: apt-get update (${source#deb }, private lists in $dir)"
  apt-get "${apt_opts[@]}" update -qq
}
