/*
 * libmokka-fence.so: the one thing the daemon's Python cannot do itself, a memory barrier.
 * The daemon writes the shared state (mokka_state.h) from Python through cffi: a seqlock's
 * odd count, the records, the even count. x86 shows other CPUs those stores in program order;
 * Arm does not, so on Arm the daemon calls this between the steps (mokkafs/daemon/shm/publisher.py).
 */
void mokka_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
