// The emulator's context switch between fibers (CUDA threads) and a worker's scheduler, in assembly
// for x86-64 and aarch64, on ELF (Linux, the BSDs) and Mach-O (macOS). llmcupy_sim.h includes it
// where LLMCUPY_SIM_ASM_SWITCH is set; elsewhere, or with -DLLMCUPY_SIM_UCONTEXT (the environment's
// LLMCUPY_SIM_UCONTEXT=1), fibers switch with ucontext, which is portable but about ten times slower
// because it saves the signal mask with a system call at every switch.
//
// llmcupy_sim_switch(save_sp, new_sp) pushes the callee-saved registers and the floating-point
// control register(s) on the stack it leaves, stores that stack pointer in *save_sp, loads new_sp
// and pops the same frame from there. A new fiber's stack is laid out as the switch leaves one
// (init_fiber_stack in llmcupy_sim.h), so its first switch "returns" into llmcupy_sim_trampoline,
// which calls the function in the frame with the argument in the frame and never returns.
//
// The instructions are the same on both object formats; only the directives and the symbol names
// differ (Mach-O prefixes C names with '_', says .private_extern for hidden and has no .type or
// .size). This header includes nothing, so a test can assemble it for every target
// (tests/test_sim_portability.py).
#ifndef LLMCUPY_SIM_SWITCH_H
#define LLMCUPY_SIM_SWITCH_H

extern "C" void llmcupy_sim_switch(void** save_sp, void* new_sp);
extern "C" void llmcupy_sim_trampoline();

#if defined(__APPLE__)
#define LLMCUPY_SIM_ASM_BEGIN(name) ".globl _" #name "\n.private_extern _" #name "\n_" #name ":\n"
#define LLMCUPY_SIM_ASM_END(name) ""
#else
#define LLMCUPY_SIM_ASM_BEGIN(name) ".globl " #name "\n.hidden " #name "\n.type " #name ",%function\n" #name ":\n"
#define LLMCUPY_SIM_ASM_END(name) ".size " #name ", .-" #name "\n"
#endif

#if defined(__aarch64__)
// AAPCS64 (and Apple's arm64 ABI): x19-x28, the frame pointer x29, the link register x30 and the low
// halves of v8-v15 (d8-d15) are callee-saved; FPCR holds the rounding mode and flush-to-zero. x18 is
// the platform's register on Apple and is left alone. A frame of 176 bytes, 16-aligned:
// [0,96) x19..x30, [96,160) d8..d15, [160,168) FPCR. The trampoline's argument and function ride in
// x19 and x20.
#define LLMCUPY_SIM_SWITCH_FRAME_WORDS 22
__asm__(
    ".text\n"
    ".p2align 2\n"
    LLMCUPY_SIM_ASM_BEGIN(llmcupy_sim_switch)
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n  stp d14, d15, [sp, #144]\n"
    "  mrs x9, fpcr\n  str x9, [sp, #160]\n"
    "  mov x9, sp\n  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldr x9, [sp, #160]\n  msr fpcr, x9\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n"
    "  ret\n"
    LLMCUPY_SIM_ASM_END(llmcupy_sim_switch)
    ".p2align 2\n"
    LLMCUPY_SIM_ASM_BEGIN(llmcupy_sim_trampoline)
    "  mov x0, x19\n"
    "  blr x20\n"
    "  brk #0\n"
    LLMCUPY_SIM_ASM_END(llmcupy_sim_trampoline));
#elif defined(__x86_64__)
// System V AMD64 (Linux, the BSDs, macOS): rbx, rbp and r12-r15 are callee-saved, and MXCSR and the
// x87 control word hold the rounding modes. A frame of 64 bytes: the control words, r15..rbp, and
// the return address the call pushed. The trampoline's argument and function ride in r12 and r13.
#define LLMCUPY_SIM_SWITCH_FRAME_WORDS 8
__asm__(
    ".text\n"
    LLMCUPY_SIM_ASM_BEGIN(llmcupy_sim_switch)
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    LLMCUPY_SIM_ASM_END(llmcupy_sim_switch)
    LLMCUPY_SIM_ASM_BEGIN(llmcupy_sim_trampoline)
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    LLMCUPY_SIM_ASM_END(llmcupy_sim_trampoline));
#else
#error "llmcupy_sim_switch.h: no assembly context switch for this CPU; build with -DLLMCUPY_SIM_UCONTEXT"
#endif

#endif  // LLMCUPY_SIM_SWITCH_H
