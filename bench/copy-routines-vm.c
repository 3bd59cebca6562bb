/* In a tools/mdvm guest (bench/copy-routines-vm.sh): dump the first bytes of
 * kernel functions (address from /proc/kallsyms, bytes from /proc/kcore), so
 * that the host can disassemble which copy instruction the guest kernel
 * patched in, and time read() of a tmpfs file into a user buffer (the
 * kernel's copy to user memory). */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static unsigned long ksym(const char *name) {
	FILE *f = fopen("/proc/kallsyms", "r"); char line[512]; unsigned long a; char t, n[256];
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "%lx %c %255s", &a, &t, n) == 3 && !strcmp(n, name)) return a;
	return 0;
}
static void dump(const char *name, int len) {
	unsigned long a = ksym(name); int fd = open("/proc/kcore", O_RDONLY); Elf64_Ehdr eh;
	if (!a || fd < 0) { printf("KDUMP %s none\n", name); return; }
	pread(fd, &eh, sizeof eh, 0);
	for (int i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph; pread(fd, &ph, sizeof ph, eh.e_phoff + i * sizeof ph);
		if (ph.p_type == PT_LOAD && a >= ph.p_vaddr && a + len <= ph.p_vaddr + ph.p_memsz) {
			unsigned char b[512]; pread(fd, b, len, ph.p_offset + (a - ph.p_vaddr));
			printf("KDUMP %s %lx ", name, a);
			for (int k = 0; k < len; k++) printf("%02x", b[k]);
			printf("\n"); return;
		}
	}
	printf("KDUMP %s nomap\n", name);
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
	dump("rep_movs_alternative", 160);
	dump("memcpy", 32);
	/* read(): copy_to_user from the page cache */
	size_t bs = 1 << 20, total = 64 << 20; char *buf = aligned_alloc(4096, bs);
	int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600); if (fd < 0) { perror(argv[1]); return 1; }
	memset(buf, 0x5a, bs);
	for (size_t o = 0; o < total; o += bs) if (write(fd, buf, bs) != (ssize_t)bs) { perror("write"); return 1; }
	for (int r = 0; r < 3; r++) {
		double t0 = now();
		for (size_t o = 0; o < total; o += bs) if (pread(fd, buf, bs, o) != (ssize_t)bs) { perror("pread"); return 1; }
		double t = now() - t0;
		if (t > 0) printf("READ tmpfs 64 MiB in 1 MiB read()s: %.3f s, %.0f MB/s\n", t, total / t / 1e6);
	}
	return 0;
}
