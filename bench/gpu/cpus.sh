# Sourced by the scripts that time on two CPUs (record_split.sh,
# record_early.sh): SECOND, a CPU on another core than CORE's, as far as
# the machine says (CORE + 1 when it says nothing). CORE must be set first.
core_of() { lscpu -p=CPU,CORE | awk -F, -v c="$1" '$1 == c { print $2 }'; }
SECOND=$(lscpu -p=CPU,CORE | awk -F, -v c="$CORE" -v k="$(core_of "$CORE")" '!/^#/ && $1 != c && $2 != k { print $1; exit }')
[ -n "$SECOND" ] || SECOND=$((CORE + 1))
