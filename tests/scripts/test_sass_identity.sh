#!/usr/bin/env bash
# scripts/sass-identity.sh's own logic, with a stub cuobjdump that prints the "library" it is given
# (here a text file holding a dump): the same code is identical; a kernel renamed with the same
# code (its call target renamed too) pairs up and is identical; one changed instruction fails,
# naming the kernel, renamed or not, as does a changed register count; a kernel missing from NEW
# fails, naming it; so does a missing library; the kernels of a library only in NEW are only in NEW.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin"
cat >"$work/bin/cuobjdump" <<'STUB'
#!/usr/bin/env bash
for lib; do :; done
cat "$lib"
STUB
chmod +x "$work/bin/cuobjdump"
export PATH="$work/bin:$PATH"
unset CUOBJDUMP SASS_LIBS

# dump MEMBER KERNEL HELPER MOV_OPERAND [KERNEL2]: one member's dump, with its resource usage, a
# kernel that calls HELPER, HELPER itself, and optionally a second kernel.
dump() {
  cat <<DUMP

member /stub/libcaracal_gemm.a:$1:

Fatbin elf code:
================
arch = sm_90a
identifier = ../src/$1

Resource usage:
 Common:
  GLOBAL:0
 Function $2:
  REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:1664 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function $3:
  REG:24 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:0 TEXTURE:0 SURFACE:0 SAMPLER:0

	code for sm_90a
	.target	sm_90a

		Function : $2
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   MOV R2, $4 ;                            /* 0x0000000000027802 */
        /*0020*/                   CALL.ABS.NOINC \`($3) ;                 /* 0x0000000000007943 */
        /*0030*/                   EXIT ;                                  /* 0x000000000000794d */
		..........


		Function : $3
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   IADD3 R2, R2, 0x1, RZ ;                 /* 0x0000000102027810 */
        /*0010*/                   RET.ABS.NODEC R20 0x0 ;                 /* 0x0000000014007950 */
DUMP
  if [ -n "${5:-}" ]; then
    cat <<DUMP

		Function : $5
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
DUMP
  fi
}
# Mangled names as nvcc writes them: a kernel template over a Gemm bundle, and a helper.
old_kernel=_ZN7caracal4gemm19grouped_gemm_kernelINS0_16UpGateSwigluGemmEEEvNS0_12KernelParamsE
new_kernel=_ZN7caracal4gemm19grouped_gemm_kernelINS0_21UpGateSwigluPairsGemmEEEvNS0_12KernelParamsE
old_helper=_ZN7caracal4gemm6helperINS0_16UpGateSwigluGemmEEEvv
new_helper=_ZN7caracal4gemm6helperINS0_21UpGateSwigluPairsGemmEEEvv
other_kernel=_ZN7caracal4gemm12other_kernelEv

# build DIR MEMBER_DUMP_ARGS...: a build folder whose libcaracal_gemm.a is that dump.
build() {
  local dir="$work/$1"
  shift
  mkdir -p "$dir"
  dump "$@" >"$dir/libcaracal_gemm.a"
}
build old up.cu.o "$old_kernel" "$old_helper" 0x5 "$other_kernel"

# check NAME EXPECTED_STATUS LAST_LINE_REGEX: runs the script on old vs NAME.
check() {
  local out status
  out=$(bash "$root/scripts/sass-identity.sh" "$work/old" "$work/$1" 2>&1)
  status=$?
  echo "---- $1"
  echo "$out"
  [ "$status" -eq "$2" ] || fail "$1: exit status $status, expected $2"
  grep -Eq "$3" <<<"$(tail -1 <<<"$out")" || fail "$1: last line is not /$3/"
  last_out=$out
}

build same up.cu.o "$old_kernel" "$old_helper" 0x5 "$other_kernel"
check same 0 "^SASS identical: 3 kernels$"

build renamed up.cu.o "$new_kernel" "$new_helper" 0x5 "$other_kernel"
check renamed 0 "^SASS identical: 3 kernels$"
grep -q "renamed, same code: caracal::gemm::grouped_gemm_kernel<caracal::gemm::UpGateSwigluGemm>" <<<"$last_out" ||
  fail "renamed: the pair is reported, demangled"
grep -q "3 kernels identical (2 of them renamed)" <<<"$last_out" || fail "renamed: the library's row"

build changed up.cu.o "$new_kernel" "$new_helper" 0x6 "$other_kernel"
check changed 1 "^FAILED: caracal::gemm::grouped_gemm_kernel<caracal::gemm::UpGateSwigluGemm>$"
grep -q "differs: caracal::gemm::grouped_gemm_kernel<caracal::gemm::UpGateSwigluGemm> (up.cu.o)" <<<"$last_out" ||
  fail "changed and renamed: the one kernel left on each side of the member pair up"

build changed_same_name up.cu.o "$old_kernel" "$old_helper" 0x6 "$other_kernel"
check changed_same_name 1 "^FAILED: caracal::gemm::grouped_gemm_kernel<caracal::gemm::UpGateSwigluGemm>$"
grep -q "differs: caracal::gemm::grouped_gemm_kernel<caracal::gemm::UpGateSwigluGemm> (up.cu.o)" <<<"$last_out" ||
  fail "changed: the kernel differs"
grep -q "MOV R2, 0x5 .*|  .*MOV R2, 0x6" <<<"$last_out" || fail "changed: the first differing line, old | new"
grep -q "libcaracal_gemm.a  *2 of 3 kernels identical$" <<<"$last_out" || fail "changed: the library's row"

build missing up.cu.o "$old_kernel" "$old_helper" 0x5
check missing 1 "^FAILED: caracal::gemm::other_kernel$"
grep -q "only in OLD: caracal::gemm::other_kernel (up.cu.o)" <<<"$last_out" || fail "missing: only in OLD"

build registers up.cu.o "$old_kernel" "$old_helper" 0x5 "$other_kernel"
sed -i 's/REG:168/REG:160/' "$work/registers/libcaracal_gemm.a"
check registers 1 "^FAILED: caracal::gemm::grouped_gemm_kernel<caracal::gemm::UpGateSwigluGemm>$"

mkdir -p "$work/nolib"
check nolib 1 "^FAILED: libcaracal_gemm.a$"

build new_library up.cu.o "$old_kernel" "$old_helper" 0x5 "$other_kernel"
dump check.cu.o "$other_kernel" "$old_helper" 0x5 | sed 's/libcaracal_gemm/libcaracal_checks/' >"$work/new_library/libcaracal_checks.a"
check new_library 1 "^FAILED: caracal::gemm::other_kernel, caracal::gemm::helper<caracal::gemm::UpGateSwigluGemm>$"
grep -q "only in NEW: caracal::gemm::other_kernel (check.cu.o)" <<<"$last_out" || fail "new library: only in NEW"
grep -q "libcaracal_gemm.a  *3 kernels identical$" <<<"$last_out" || fail "new library: the old library's row"

finish test_sass_identity
