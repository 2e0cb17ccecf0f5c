/*
 * scan: allocate anonymous memory, fill it with realistic content, scan it.
 *
 * A re-creation of the "scan" page-replacement test (linux-mm.org
 * PageReplacementTesting) used by compcache's seed benchmark 004
 * ("./scan 480 10" in a 512 MiB machine), written from its description:
 *
 *   scan [options] MIB PASSES
 *
 * Modes (-m):
 *   cyclic  fill MIB once, then read every page PASSES times in the same
 *           order. This is LRU's worst case: the page needed next is always
 *           the one evicted longest ago, so every pass faults in whatever
 *           did not fit.
 *   once    use-once: each pass writes fresh content into every page, reads
 *           it once and drops it with MADV_DONTNEED. Freed pages free their
 *           swap slots, so this also exercises the swap-free/discard path.
 *
 * Content: the seed's machines swapped real program memory, which compresses
 * neither like zeros nor like noise. By default every page is drawn from a
 * mix of four kinds, chosen per page by a hash of (seed, pass, page):
 *
 *   same    10%  zero-filled pages (3 in 4) or one repeated word (1 in 4):
 *                fresh heap, bss, cleared buffers. zram stores these as
 *                "same_pages"; since Linux 6.12 zero-filled pages do not
 *                even reach the swap device (the swap layer keeps a bitmap).
 *   text    30%  Zipf-distributed words, identifiers and numbers: strings,
 *                source, logs, documents.
 *   struct  52%  64-byte records of heap-like pointers, small lengths,
 *                flags, refcounts, a 32-bit hash and zero padding: the
 *                object graphs of C/C++/Python/JS heaps.
 *   random   8%  uniform random bytes: already compressed data, media,
 *                crypto state. Incompressible; zram stores these "huge".
 *
 * Checked against real anonymous pages dumped by tools/pagedump from Python,
 * Node.js and Java programs (data/pages-*.bin): per-page zlib level 1 gives
 * 2.8-3.2:1 on those and 2.4:1 on this mix (text 2.2:1, struct 3.1:1), so the
 * mix is, if anything, a little harder to compress than real heaps. zram
 * studies on desktops and phones report 2.5-4:1 overall; seed 002 saw 4:1.
 * Change the shares with -x. For real content, -p FILE fills the region by
 * cycling through the 4096-byte pages of FILE (a raw page dump such as
 * data/pages-mixed.bin; a trailing partial page is ignored).
 *
 * Verification (-V): a 64-bit hash of every page is recorded when it is
 * written and compared after each pass; any mismatch is reported and the
 * program exits 2. This makes scan a correctness check of the swap device as
 * well as a benchmark.
 *
 * Output: progress on stderr (-v), one summary line on stdout:
 *   scan mib=480 passes=10 mode=cyclic ... fill_s=0.41 scan_s=3.20 total_s=3.61 verify=ok mismatches=0
 *
 * With -H (--hold) the program keeps its memory after the summary line until it
 * is killed: a ballast of anonymous memory for the file I/O experiment.
 *
 * Exit status: 0 ok, 1 usage or system error, 2 content mismatch.
 *
 * Self-contained C99 + POSIX so that it builds with `gcc -O2 -static` for a
 * busybox initramfs guest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE_BYTES 4096u
#define PAGE_WORDS (PAGE_BYTES / 8u)

enum kind { KIND_SAME, KIND_TEXT, KIND_STRUCT, KIND_RANDOM, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = { "same", "text", "struct", "random" };

struct options {
	size_t mib;
	unsigned passes;
	int once;		/* use-once mode instead of cyclic */
	int verify;
	int dirty;		/* write one word back per page per pass */
	int verbose;
	int hold;		/* after the last pass, keep the memory until killed */
	uint64_t seed;
	unsigned mix[KIND_COUNT];	/* percent, sums to 100 */
	const char *pages_path;
	const char *dump_path;	/* write the filled region to a file (to inspect the content) */
};

struct page_source {
	int fd;
	size_t nr_pages;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t mix3(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t s = a ^ (b * 0xd6e8feb86659fd93ull) ^ (c * 0xa0761d6478bd642full);
	return splitmix64(&s);
}

static uint64_t page_hash(const uint64_t *p)
{
	uint64_t h = 0x243f6a8885a308d3ull;
	for (unsigned i = 0; i < PAGE_WORDS; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
		h ^= h >> 29;
	}
	return h;
}

/* Words for text pages: common English, C/Python identifiers, log words. */
static const char *const words[] = {
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with",
	"was", "on", "be", "by", "this", "are", "from", "or", "an", "which",
	"memory", "page", "swap", "device", "compressed", "kernel", "process",
	"return", "if", "else", "while", "struct", "static", "int", "char",
	"self", "def", "import", "None", "True", "False", "len", "value", "key",
	"error", "warning", "info", "debug", "request", "response", "user",
	"http", "GET", "POST", "json", "string", "buffer", "size", "count",
	"index", "thesis", "chapter", "figure", "table", "result", "data",
	"function", "module", "config", "timeout", "connection", "server",
};
#define NR_WORDS (sizeof(words) / sizeof(words[0]))
static const char punct[] = " ,.;:()\n=\"_-/ ";

static void fill_text(unsigned char *p, uint64_t rng)
{
	size_t off = 0;
	while (off < PAGE_BYTES) {
		uint64_t r = splitmix64(&rng);
		char tmp[32];
		const char *w;
		size_t n;
		if ((r & 15) == 0) {
			/* Numbers: timestamps, sizes, ids. */
			n = (size_t)snprintf(tmp, sizeof(tmp), "%llu",
					     (unsigned long long)((r >> 8) % 10000000));
			w = tmp;
		} else {
			/* Zipf-like: the smaller of two picks, so common words dominate. */
			size_t a = (r >> 8) % NR_WORDS, b = (r >> 20) % NR_WORDS;
			w = words[a < b ? a : b];
			n = strlen(w);
		}
		for (size_t i = 0; i < n && off < PAGE_BYTES; i++)
			p[off++] = (unsigned char)w[i];
		if (off < PAGE_BYTES)
			p[off++] = ((r >> 36) & 3) ? ' ' : (unsigned char)punct[(r >> 40) % (sizeof(punct) - 1)];
	}
}

static void fill_struct(uint64_t *p, uint64_t rng)
{
	/* A heap arena: pointers cluster near a base, like malloc'd objects. */
	uint64_t base = 0x000055d4a0000000ull + ((splitmix64(&rng) & 0xfff) << 20);
	for (unsigned i = 0; i < PAGE_WORDS; i += 8) {
		uint64_t r = splitmix64(&rng);
		p[i + 0] = base + ((r & 0xffff) << 4);			/* next */
		p[i + 1] = (r & 0x10000) ? 0 : base + (((r >> 17) & 0xffff) << 4); /* data or NULL */
		p[i + 2] = (r >> 33) & 0xfff;				/* length */
		p[i + 3] = ((r >> 45) & 0x7) | 0x100;			/* flags */
		p[i + 4] = 1 + ((r >> 48) & 0x3);			/* refcount */
		p[i + 5] = splitmix64(&rng) & 0xffffffffull;		/* hash */
		p[i + 6] = 0;
		p[i + 7] = 0;
	}
}

static void fill_random(uint64_t *p, uint64_t rng)
{
	for (unsigned i = 0; i < PAGE_WORDS; i++)
		p[i] = splitmix64(&rng);
}

static enum kind page_kind(const struct options *o, uint64_t h)
{
	unsigned pct = (unsigned)(h % 100);
	unsigned acc = 0;
	for (int k = 0; k < KIND_COUNT; k++) {
		acc += o->mix[k];
		if (pct < acc)
			return (enum kind)k;
	}
	return KIND_RANDOM;
}

static void fill_generated(const struct options *o, uint64_t *p, size_t pageno,
			   unsigned pass, size_t counts[KIND_COUNT])
{
	uint64_t h = mix3(o->seed, pass, pageno);
	enum kind k = page_kind(o, h);
	uint64_t rng = h >> 7;
	counts[k]++;
	switch (k) {
	case KIND_SAME:
		if ((h >> 20) & 3) {
			memset(p, 0, PAGE_BYTES);
		} else {
			uint64_t w = splitmix64(&rng);
			for (unsigned i = 0; i < PAGE_WORDS; i++)
				p[i] = w;
		}
		break;
	case KIND_TEXT:
		fill_text((unsigned char *)p, rng);
		break;
	case KIND_STRUCT:
		fill_struct(p, rng);
		break;
	default:
		fill_random(p, rng);
		break;
	}
}

static int fill_from_file(const struct page_source *src, uint64_t *p, size_t pageno,
			  unsigned pass)
{
	size_t idx = (pageno + (size_t)pass * 7919u) % src->nr_pages;
	ssize_t n = pread(src->fd, p, PAGE_BYTES, (off_t)(idx * PAGE_BYTES));
	if (n != (ssize_t)PAGE_BYTES) {
		fprintf(stderr, "scan: short read of page %zu from page file: %s\n", idx,
			n < 0 ? strerror(errno) : "end of file");
		return -1;
	}
	return 0;
}

/* Writes every page of the region; records hashes when verifying. */
static int fill_region(const struct options *o, const struct page_source *src,
		       unsigned char *region, size_t nr_pages, unsigned pass,
		       uint64_t *hashes, size_t counts[KIND_COUNT])
{
	for (size_t i = 0; i < nr_pages; i++) {
		uint64_t *p = (uint64_t *)(region + i * PAGE_BYTES);
		if (src->fd >= 0) {
			if (fill_from_file(src, p, i, pass))
				return -1;
		} else {
			fill_generated(o, p, i, pass, counts);
		}
		if (hashes)
			hashes[i] = page_hash(p);
		/* The page file's cache is charged to our memory cgroup and would
		 * push the region out while it is being filled: drop it as we go. */
		if (src->fd >= 0 && i % 2048 == 2047)
			posix_fadvise(src->fd, 0, 0, POSIX_FADV_DONTNEED);
	}
	if (src->fd >= 0)
		posix_fadvise(src->fd, 0, 0, POSIX_FADV_DONTNEED);
	return 0;
}

/*
 * Reads every page once. With hashes, a page whose content changed since it
 * was written counts as a mismatch. With dirty, one word per page is written
 * back unchanged so the page must be written to swap again when evicted.
 */
static size_t scan_region(const struct options *o, unsigned char *region, size_t nr_pages,
			  const uint64_t *hashes, uint64_t *sink, unsigned pass)
{
	size_t mismatches = 0;
	uint64_t sum = 0;
	for (size_t i = 0; i < nr_pages; i++) {
		uint64_t *p = (uint64_t *)(region + i * PAGE_BYTES);
		if (hashes) {
			if (page_hash(p) != hashes[i]) {
				if (mismatches < 10)
					fprintf(stderr, "scan: MISMATCH pass %u page %zu (offset %zu)\n",
						pass, i, i * PAGE_BYTES);
				mismatches++;
			}
		} else {
			for (unsigned w = 0; w < PAGE_WORDS; w += 8)
				sum += p[w];
		}
		if (o->dirty) {
			volatile uint64_t *vp = p;
			vp[0] = vp[0];
		}
	}
	*sink += sum;
	return mismatches;
}

static int dump_region(const char *path, const unsigned char *region, size_t bytes)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	size_t off = 0;
	if (fd < 0) {
		fprintf(stderr, "scan: cannot create %s: %s\n", path, strerror(errno));
		return -1;
	}
	while (off < bytes) {
		ssize_t n = write(fd, region + off, bytes - off);
		if (n <= 0) {
			fprintf(stderr, "scan: write to %s failed: %s\n", path, strerror(errno));
			close(fd);
			return -1;
		}
		off += (size_t)n;
	}
	return close(fd);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: scan [options] MIB PASSES\n"
		"  -m, --mode cyclic|once  access pattern (default cyclic)\n"
		"  -p, --pages FILE        fill from raw 4096-byte pages of FILE\n"
		"  -x, --mix S:T:X:R       percent of same/text/struct/random pages (default 10:30:52:8)\n"
		"  -s, --seed N            content seed (default 1)\n"
		"  -V, --verify            check every page's content after each pass (exit 2 on mismatch)\n"
		"  -w, --dirty             write back one word per page per pass\n"
		"  -v, --verbose           per-pass progress on stderr\n"
		"  -D, --dump FILE         after filling, write the region to FILE\n"
		"  -H, --hold              after the last pass keep the memory until a signal (ballast)\n"
		"  -h, --help\n");
}

static int parse_mix(const char *s, unsigned mix[KIND_COUNT])
{
	unsigned v[KIND_COUNT];
	if (sscanf(s, "%u:%u:%u:%u", &v[0], &v[1], &v[2], &v[3]) != 4)
		return -1;
	if (v[0] + v[1] + v[2] + v[3] != 100)
		return -1;
	memcpy(mix, v, sizeof(v));
	return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "mode", required_argument, 0, 'm' },
		{ "pages", required_argument, 0, 'p' },
		{ "mix", required_argument, 0, 'x' },
		{ "seed", required_argument, 0, 's' },
		{ "verify", no_argument, 0, 'V' },
		{ "dirty", no_argument, 0, 'w' },
		{ "verbose", no_argument, 0, 'v' },
		{ "hold", no_argument, 0, 'H' },
		{ "dump", required_argument, 0, 'D' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;
	char *end;
	memset(o, 0, sizeof(*o));
	o->seed = 1;
	o->mix[KIND_SAME] = 10;
	o->mix[KIND_TEXT] = 30;
	o->mix[KIND_STRUCT] = 52;
	o->mix[KIND_RANDOM] = 8;
	while ((c = getopt_long(argc, argv, "m:p:x:s:VwvHD:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (!strcmp(optarg, "cyclic"))
				o->once = 0;
			else if (!strcmp(optarg, "once"))
				o->once = 1;
			else {
				fprintf(stderr, "scan: unknown mode '%s' (cyclic or once)\n", optarg);
				return -1;
			}
			break;
		case 'p':
			o->pages_path = optarg;
			break;
		case 'x':
			if (parse_mix(optarg, o->mix)) {
				fprintf(stderr, "scan: --mix wants four percentages summing to 100, got '%s'\n", optarg);
				return -1;
			}
			break;
		case 's':
			o->seed = strtoull(optarg, &end, 0);
			if (*end) {
				fprintf(stderr, "scan: bad seed '%s'\n", optarg);
				return -1;
			}
			break;
		case 'V':
			o->verify = 1;
			break;
		case 'w':
			o->dirty = 1;
			break;
		case 'v':
			o->verbose = 1;
			break;
		case 'H':
			o->hold = 1;
			break;
		case 'D':
			o->dump_path = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		return -1;
	}
	o->mib = strtoull(argv[optind], &end, 10);
	if (*end || o->mib == 0) {
		fprintf(stderr, "scan: MIB must be a positive integer, got '%s'\n", argv[optind]);
		return -1;
	}
	o->passes = (unsigned)strtoul(argv[optind + 1], &end, 10);
	if (*end) {
		fprintf(stderr, "scan: PASSES must be an integer, got '%s'\n", argv[optind + 1]);
		return -1;
	}
	return 0;
}

static int open_pages(const char *path, struct page_source *src)
{
	struct stat st;
	src->fd = open(path, O_RDONLY);
	if (src->fd < 0) {
		fprintf(stderr, "scan: cannot open page file %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (fstat(src->fd, &st) < 0 || st.st_size < (off_t)PAGE_BYTES) {
		fprintf(stderr, "scan: page file %s holds no whole 4096-byte page\n", path);
		return -1;
	}
	src->nr_pages = (size_t)st.st_size / PAGE_BYTES;
	return 0;
}

int main(int argc, char **argv)
{
	struct options o;
	struct page_source src = { .fd = -1, .nr_pages = 0 };
	size_t counts[KIND_COUNT] = { 0 };
	size_t mismatches = 0;
	uint64_t sink = 0;
	double t0, t_fill = 0, t_scan = 0;

	if (parse_options(argc, argv, &o))
		return 1;
	if (o.pages_path && open_pages(o.pages_path, &src))
		return 1;

	size_t bytes = o.mib << 20;
	size_t nr_pages = bytes / PAGE_BYTES;
	unsigned char *region = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED) {
		fprintf(stderr, "scan: mmap of %zu MiB failed: %s\n", o.mib, strerror(errno));
		return 1;
	}
	/* Transparent huge pages would swap as 4 KiB pages anyway, but would
	 * change the fault pattern the seed measured; keep base pages. */
	madvise(region, bytes, MADV_NOHUGEPAGE);
	uint64_t *hashes = NULL;
	if (o.verify) {
		hashes = calloc(nr_pages, sizeof(*hashes));
		if (!hashes) {
			fprintf(stderr, "scan: no memory for %zu page hashes\n", nr_pages);
			return 1;
		}
	}

	double start = now_s();
	if (!o.once) {
		t0 = now_s();
		if (fill_region(&o, &src, region, nr_pages, 0, hashes, counts))
			return 1;
		t_fill += now_s() - t0;
		if (o.verbose)
			fprintf(stderr, "scan: filled %zu MiB in %.2f s\n", o.mib, t_fill);
		if (o.dump_path && dump_region(o.dump_path, region, bytes))
			return 1;
	}
	for (unsigned pass = 0; pass < o.passes; pass++) {
		double tp = now_s();
		if (o.once) {
			t0 = now_s();
			if (fill_region(&o, &src, region, nr_pages, pass + 1, hashes, counts))
				return 1;
			t_fill += now_s() - t0;
		}
		t0 = now_s();
		size_t bad = scan_region(&o, region, nr_pages, hashes, &sink, pass);
		mismatches += bad;
		if (o.once)
			madvise(region, bytes, MADV_DONTNEED);
		t_scan += now_s() - t0;
		if (o.verbose)
			fprintf(stderr, "scan: pass %u/%u %.2f s%s\n", pass + 1, o.passes,
				now_s() - tp, bad ? " MISMATCH" : "");
	}
	double total = now_s() - start;

	size_t gen = counts[0] + counts[1] + counts[2] + counts[3];
	printf("scan mib=%zu passes=%u mode=%s content=%s", o.mib, o.passes,
	       o.once ? "once" : "cyclic", o.pages_path ? "file" : "generated");
	if (gen)
		for (int k = 0; k < KIND_COUNT; k++)
			printf(" %s_pages=%zu", kind_names[k], counts[k]);
	printf(" fill_s=%.3f scan_s=%.3f total_s=%.3f verify=%s mismatches=%zu sink=%llu\n",
	       t_fill, t_scan, total, !o.verify ? "off" : (mismatches ? "FAIL" : "ok"),
	       mismatches, (unsigned long long)(sink & 0xffff));
	fflush(stdout);
	if (o.hold && !mismatches && !o.once)
		for (;;)
			pause();
	if (mismatches) {
		fprintf(stderr, "scan: %zu page(s) changed content: the swap device lost data\n",
			mismatches);
		return 2;
	}
	return 0;
}
