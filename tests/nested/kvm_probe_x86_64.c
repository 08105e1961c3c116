// A minimal real KVM user for the nested harness's self-test on x86_64: one
// VM, one vCPU in 64-bit long mode (identity-mapped 2 MiB page), no in-kernel
// irqchip (with one, HLT with interrupts off would sleep in the kernel
// instead of exiting). The guest counts RCX down from 100000 and then writes
// 0x42 to port 0x3f8. Prints what KVM reported and exits 0 only when that is
// exactly the expected port-I/O exit with RCX at 0.
//
// Build: zig cc -target x86_64-linux-musl -static -O2 (build-probe.sh).
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define MEM_SIZE 0x200000u /* guest RAM at GPA 0, identity mapped */
#define PML4 0x1000u
#define PDPT 0x2000u
#define PD 0x3000u
#define CODE 0x10000u

// The guest, hand-assembled (64-bit mode):
//   b9 a0 86 01 00   mov   ecx, 100000
//   ff c9          1: dec  ecx
//   75 fc            jnz   1b
//   66 ba f8 03      mov   dx, 0x3f8
//   b0 42            mov   al, 0x42
//   ee               out   dx, al
//   f4               hlt            (never reached: the OUT exits first)
static const uint8_t guest[] = {
    0xb9, 0xa0, 0x86, 0x01, 0x00, 0xff, 0xc9, 0x75, 0xfc,
    0x66, 0xba, 0xf8, 0x03, 0xb0, 0x42, 0xee, 0xf4,
};

static void die(const char *what) {
  fprintf(stderr, "kvm-probe: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int xioctl(int fd, unsigned long req, void *arg, const char *what) {
  int r = ioctl(fd, req, arg);
  if (r < 0) die(what);
  return r;
}

int main(void) {
  int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (kvm < 0) die("open /dev/kvm");
  int api = ioctl(kvm, KVM_GET_API_VERSION, 0);
  if (api != KVM_API_VERSION) {
    fprintf(stderr, "kvm-probe: KVM API %d, want %d\n", api, KVM_API_VERSION);
    return 1;
  }
  int vm = xioctl(kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM");

  uint8_t *mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap guest memory");
  struct kvm_userspace_memory_region region = {
      .slot = 0, .guest_phys_addr = 0, .memory_size = MEM_SIZE, .userspace_addr = (uintptr_t)mem};
  xioctl(vm, KVM_SET_USER_MEMORY_REGION, &region, "KVM_SET_USER_MEMORY_REGION");

  // PML4[0] -> PDPT, PDPT[0] -> PD, PD[0] = 2 MiB page at 0 (present, writable, PS).
  *(uint64_t *)(mem + PML4) = PDPT | 0x3;
  *(uint64_t *)(mem + PDPT) = PD | 0x3;
  *(uint64_t *)(mem + PD) = 0x83;
  memcpy(mem + CODE, guest, sizeof guest);

  int vcpu = xioctl(vm, KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU");
  int run_size = xioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE");
  struct kvm_run *run = mmap(NULL, run_size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
  if (run == MAP_FAILED) die("mmap kvm_run");

  // KVM refuses EFER.LME unless the guest's CPUID has long mode.
  size_t n = 256;
  struct kvm_cpuid2 *cpuid = calloc(1, sizeof *cpuid + n * sizeof(struct kvm_cpuid_entry2));
  if (!cpuid) die("calloc");
  cpuid->nent = n;
  xioctl(kvm, KVM_GET_SUPPORTED_CPUID, cpuid, "KVM_GET_SUPPORTED_CPUID");
  xioctl(vcpu, KVM_SET_CPUID2, cpuid, "KVM_SET_CPUID2");

  struct kvm_sregs sregs;
  xioctl(vcpu, KVM_GET_SREGS, &sregs, "KVM_GET_SREGS");
  struct kvm_segment code = {.base = 0, .limit = 0xffffffff, .selector = 8, .type = 11,
                             .present = 1, .dpl = 0, .db = 0, .s = 1, .l = 1, .g = 1};
  struct kvm_segment data = code;
  data.selector = 16;
  data.type = 3;
  data.l = 0;
  data.db = 1;
  sregs.cs = code;
  sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data;
  sregs.cr3 = PML4;
  sregs.cr4 = 1u << 5;                      /* PAE */
  sregs.cr0 = 0x80000001u | (1u << 4);      /* PG | PE | ET */
  sregs.efer = (1u << 8) | (1u << 10);      /* LME | LMA */
  xioctl(vcpu, KVM_SET_SREGS, &sregs, "KVM_SET_SREGS");

  struct kvm_regs regs = {.rip = CODE, .rflags = 0x2, .rsp = MEM_SIZE};
  xioctl(vcpu, KVM_SET_REGS, &regs, "KVM_SET_REGS");

  xioctl(vcpu, KVM_RUN, 0, "KVM_RUN");
  xioctl(vcpu, KVM_GET_REGS, &regs, "KVM_GET_REGS");
  if (run->exit_reason != KVM_EXIT_IO) {
    printf("unexpected exit reason %u at rip=0x%llx\n", run->exit_reason, (unsigned long long)regs.rip);
    return 1;
  }
  uint8_t value = *((uint8_t *)run + run->io.data_offset);
  printf("KVM_EXIT_IO dir=%s port=0x%x size=%u count=%u value=0x%02x rcx=%llu\n",
         run->io.direction == KVM_EXIT_IO_OUT ? "out" : "in", run->io.port, run->io.size,
         run->io.count, value, (unsigned long long)regs.rcx);
  int ok = run->io.direction == KVM_EXIT_IO_OUT && run->io.port == 0x3f8 && run->io.size == 1 &&
           run->io.count == 1 && value == 0x42 && regs.rcx == 0;
  return ok ? 0 : 1;
}
