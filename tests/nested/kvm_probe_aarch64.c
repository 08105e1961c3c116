// A minimal real KVM user for the nested harness's self-test on aarch64: one
// VM, one vCPU set up with KVM_ARM_VCPU_INIT (the preferred target), 64 KiB
// of RAM at 0x40000000 holding the guest. The guest counts X2 down from
// 100000 and then stores 0x42 to 0x10000000, where no memory slot is, so KVM
// exits with KVM_EXIT_MMIO. Prints what KVM reported and exits 0 only when
// that is exactly the expected MMIO write with X2 at 0.
//
// Build: zig cc -target aarch64-linux-musl -static -O2 (build-probe.sh).
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define RAM_BASE 0x40000000u
#define RAM_SIZE 0x10000u
#define MMIO_ADDR 0x10000000u

// The guest, hand-assembled (A64, little-endian words):
//   d2a20000   movz x0, #0x1000, lsl #16   // x0 = 0x10000000
//   d2800841   movz x1, #0x42
//   d290d402   movz x2, #0x86a0
//   f2a00022   movk x2, #0x1, lsl #16      // x2 = 100000
//   f1000442 1: subs x2, x2, #1
//   54ffffe1   b.ne 1b
//   b9000001   str  w1, [x0]               // MMIO exit
//   14000000   b    .
static const uint32_t guest[] = {
    0xd2a20000, 0xd2800841, 0xd290d402, 0xf2a00022,
    0xf1000442, 0x54ffffe1, 0xb9000001, 0x14000000,
};

#define CORE_REG(field) \
  (KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | (offsetof(struct kvm_regs, field) / sizeof(uint32_t)))

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

  uint8_t *mem = mmap(NULL, RAM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap guest memory");
  memcpy(mem, guest, sizeof guest);
  struct kvm_userspace_memory_region region = {
      .slot = 0, .guest_phys_addr = RAM_BASE, .memory_size = RAM_SIZE, .userspace_addr = (uintptr_t)mem};
  xioctl(vm, KVM_SET_USER_MEMORY_REGION, &region, "KVM_SET_USER_MEMORY_REGION");

  int vcpu = xioctl(vm, KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU");
  int run_size = xioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE");
  struct kvm_run *run = mmap(NULL, run_size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
  if (run == MAP_FAILED) die("mmap kvm_run");

  struct kvm_vcpu_init init;
  xioctl(vm, KVM_ARM_PREFERRED_TARGET, &init, "KVM_ARM_PREFERRED_TARGET");
  xioctl(vcpu, KVM_ARM_VCPU_INIT, &init, "KVM_ARM_VCPU_INIT");

  uint64_t pc = RAM_BASE;
  struct kvm_one_reg reg = {.id = CORE_REG(regs.pc), .addr = (uintptr_t)&pc};
  xioctl(vcpu, KVM_SET_ONE_REG, &reg, "KVM_SET_ONE_REG pc");

  xioctl(vcpu, KVM_RUN, 0, "KVM_RUN");
  uint64_t x2 = ~0ull;
  reg.id = CORE_REG(regs.regs[2]);
  reg.addr = (uintptr_t)&x2;
  xioctl(vcpu, KVM_GET_ONE_REG, &reg, "KVM_GET_ONE_REG x2");
  if (run->exit_reason != KVM_EXIT_MMIO) {
    printf("unexpected exit reason %u\n", run->exit_reason);
    return 1;
  }
  uint32_t data = 0;
  memcpy(&data, run->mmio.data, run->mmio.len < 4 ? run->mmio.len : 4);
  printf("KVM_EXIT_MMIO addr=0x%llx len=%u write=%u data=0x%x x2=%llu target=%u\n",
         (unsigned long long)run->mmio.phys_addr, run->mmio.len, run->mmio.is_write, data,
         (unsigned long long)x2, init.target);
  int ok = run->mmio.phys_addr == MMIO_ADDR && run->mmio.len == 4 && run->mmio.is_write &&
           data == 0x42 && x2 == 0;
  return ok ? 0 : 1;
}
