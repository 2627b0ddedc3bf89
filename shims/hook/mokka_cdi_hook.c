/* mokka-cdi-hook: an OCI createContainer hook that gives a container the node's procfs entries.
 *
 *   mokka-cdi-hook proc [--if-present] SOURCE     (the OCI state on standard input)
 *
 * On a real node /proc/driver/nvidia, /proc/driver/nvidia-caps and the driver's lines of
 * /proc/devices come from the kernel module, so every container sees them in its own procfs.
 * Here the kernel has no such module and the entries are the mount's SOURCE (MNT/proc: its
 * driver/ directory and devices file); no volume can put them there, because runc refuses any
 * mount whose target is inside /proc. NVIDIA's device plugin reads
 * /proc/driver/nvidia-caps/mig-minors at that absolute path to name a MIG device's capability
 * nodes, and its DRA plugin the capability files under /proc/driver/nvidia/capabilities and the
 * nvidia-caps major in /proc/devices: without them neither can give a pod a MIG device.
 *
 * A runtime runs createContainer hooks in the container's mount namespace once its mounts (its
 * /proc among them) are made and before it changes root, with the host's paths still in view.
 * The hook finds the container's root from the state's bundle (config.json's root.path), opens
 * <root>/proc, its driver directory and its devices file without following any link and only
 * when they are procfs's, and bind-mounts SOURCE/driver and SOURCE/devices there read-only
 * (nosuid, nodev, noexec). The whole of /proc/driver is covered: a real host's other entries there
 * (rtc) are hidden in the container; SOURCE/devices is a stock kernel's list plus the driver's.
 *
 * With --if-present (a runtime's base spec gives every container the hook, as the kernel gives
 * every container its procfs) a SOURCE that is not there (no node mounted yet, or its daemon
 * gone: ENOENT, ENOTCONN) is nothing to do: exit 0, the container starts without the entries, as
 * on a node whose driver is not loaded.
 *
 * Everything it reads is bounded and checked; on any doubt it refuses with one line on standard
 * error and exit 1, which makes the runtime refuse the container rather than start it without
 * the driver's entries. Built static (setup.py), so it runs on any host's libc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#ifndef PROC_SUPER_MAGIC
#define PROC_SUPER_MAGIC 0x9fa0
#endif

#define STATE_MAX (1u << 20)   /* the OCI state: a few hundred bytes, annotations aside */
#define CONFIG_MAX (16u << 20) /* config.json: a few KiB, large environments aside */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mokka-cdi-hook: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* Read all of fd, at most `max` bytes (more is refused), NUL-terminated. */
static char *read_bounded(int fd, size_t max, const char *what) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) die("%s: out of memory", what);
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max) die("%s: larger than %zu bytes", what, max);
            cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) die("%s: out of memory", what);
            buf = grown;
        }
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("%s: %s", what, strerror(errno));
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    if (len > max) die("%s: larger than %zu bytes", what, max);
    buf[len] = '\0';
    if (strlen(buf) != len) die("%s: holds a NUL byte", what);
    return buf;
}

/* ---- the little JSON this needs: skip any value, read a string, find a key of an object ---- */

static const char *ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* A string at p (at its quote) into out (when not NULL, at most outsz bytes with the NUL);
 * returns the byte after its closing quote, or NULL when malformed, too long, or using an escape
 * a path never needs (\u). */
static const char *string(const char *p, char *out, size_t outsz) {
    if (*p != '"') return NULL;
    size_t n = 0;
    for (p++; *p != '"'; p++) {
        char c = *p;
        if (c == '\0' || (unsigned char)c < 0x20) return NULL;
        if (c == '\\') {
            p++;
            switch (*p) {
            case '"': case '\\': case '/': c = *p; break;
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':
                if (out) return NULL; /* not in a path we use; skipping one is fine */
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || p[i] == '\0') return NULL;
                p += 4;
                continue;
            default: return NULL;
            }
        }
        if (out) {
            if (n + 1 >= outsz) return NULL;
            out[n++] = c;
        }
    }
    if (out) out[n] = '\0';
    return p + 1;
}

static const char *value(const char *p, int depth);

static const char *container(const char *p, int depth, char close) {
    if (depth > 64) return NULL;
    p = ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
        if (close == '}') {
            p = string(ws(p), NULL, 0);
            if (!p) return NULL;
            p = ws(p);
            if (*p++ != ':') return NULL;
        }
        p = value(ws(p), depth + 1);
        if (!p) return NULL;
        p = ws(p);
        if (*p == ',') { p++; continue; }
        if (*p == close) return p + 1;
        return NULL;
    }
}

static const char *value(const char *p, int depth) {
    p = ws(p);
    switch (*p) {
    case '{': return container(p, depth, '}');
    case '[': return container(p, depth, ']');
    case '"': return string(p, NULL, 0);
    case 't': return strncmp(p, "true", 4) ? NULL : p + 4;
    case 'f': return strncmp(p, "false", 5) ? NULL : p + 5;
    case 'n': return strncmp(p, "null", 4) ? NULL : p + 4;
    default:
        if (*p != '-' && (*p < '0' || *p > '9')) return NULL;
        while (*p && strchr("+-.eE0123456789", *p)) p++;
        return p;
    }
}

/* The whole of doc is one JSON value, or the hook refuses it: a document cut short or with
 * something after it is not what a runtime writes. */
static void whole(const char *doc, const char *what) {
    const char *end = value(doc, 0);
    if (!end || *ws(end) != '\0') die("%s: not valid JSON", what);
}

/* In the object at p, the value of member `key` (the start of it), or NULL. */
static const char *member(const char *p, const char *key) {
    p = ws(p);
    if (*p != '{') return NULL;
    p = ws(p + 1);
    if (*p == '}') return NULL;
    for (;;) {
        char name[64];
        const char *after = string(ws(p), name, sizeof name);
        if (!after) {  /* a longer name than ours: skip it */
            name[0] = '\0';
            after = string(ws(p), NULL, 0);
            if (!after) return NULL;
        }
        p = ws(after);
        if (*p++ != ':') return NULL;
        p = ws(p);
        if (strcmp(name, key) == 0) return p;
        p = value(p, 1);
        if (!p) return NULL;
        p = ws(p);
        if (*p == ',') { p++; continue; }
        return NULL;
    }
}

static void string_member(const char *doc, const char *key, char *out, size_t outsz, const char *what) {
    const char *v = member(doc, key);
    if (!v) die("%s: no \"%s\"", what, key);
    if (!string(v, out, outsz) || out[0] == '\0') die("%s: \"%s\" is not a path string", what, key);
}

/* The container's root: config.json's root.path, relative to the bundle unless absolute. */
static void container_root(const char *state, char *root, size_t rootsz) {
    char bundle[PATH_MAX];
    string_member(state, "bundle", bundle, sizeof bundle, "the OCI state on standard input");
    if (bundle[0] != '/') die("the OCI state's bundle %s is not absolute", bundle);
    int dir = open(bundle, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) die("%s: %s", bundle, strerror(errno));
    int fd = openat(dir, "config.json", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) die("%s/config.json: %s", bundle, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) die("%s/config.json: not a regular file", bundle);
    char *config = read_bounded(fd, CONFIG_MAX, "config.json");
    whole(config, "config.json");
    close(fd);
    close(dir);
    const char *r = member(config, "root");
    if (!r) die("%s/config.json: no \"root\"", bundle);
    char path[PATH_MAX];
    string_member(r, "path", path, sizeof path, "config.json's root");
    free(config);
    int n = path[0] == '/' ? snprintf(root, rootsz, "%s", path) : snprintf(root, rootsz, "%s/%s", bundle, path);
    if (n < 0 || (size_t)n >= rootsz) die("the container's root path is too long");
}

/* `name` under the container's /proc (a directory or a regular file, as `dir` says), opened
 * without following a link and only when it is procfs's own. */
static int open_proc_entry(int at, const char *name, int dir, const char *shown) {
    int fd = openat(at, name, (dir ? O_RDONLY | O_DIRECTORY : O_PATH) | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) die("%s: %s", shown, errno == ELOOP || errno == ENOTDIR ? "not a directory (a link?)" : strerror(errno));
    struct statfs fs;
    struct stat st;
    if (fstatfs(fd, &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC) die("%s: not a procfs", shown);
    if (fstat(fd, &st) != 0 || (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)))
        die("%s: not a %s", shown, dir ? "directory" : "regular file");
    return fd;
}

/* SOURCE/name, a directory or a regular file as `dir` says, not a link. */
static int open_source_entry(int src, const char *source, const char *name, int dir) {
    char from_path[PATH_MAX + 32];
    snprintf(from_path, sizeof from_path, "%s/%s", source, name);
    int from = openat(src, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (from < 0) die("%s: %s", from_path, strerror(errno));
    if (fstat(from, &st) != 0 || (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)))
        die("%s: not a %s", from_path, dir ? "directory" : "regular file");
    return from;
}

/* Whether the container's entry is `from` already: a container given the hook twice (a runtime's
 * base spec and a CDI spec's) has it bound by the first run. */
static int already_bound(int from, int proc, const char *name) {
    struct stat a, b;
    return fstat(from, &a) == 0 && fstatat(proc, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* Bind `from` (the descriptor the checks opened) over `target`, <root>/proc/name, then remount the
 * bind read-only (nosuid, nodev, noexec). */
static void bind_entry(int from, int target, int proc, const char *source, const char *shown, const char *name) {
    char a[64], b[64];
    snprintf(a, sizeof a, "/proc/self/fd/%d", from);
    snprintf(b, sizeof b, "/proc/self/fd/%d", target);
    if (mount(a, b, NULL, MS_BIND | MS_REC, NULL) != 0)
        die("bind %s/%s over %s: %s", source, name, shown, strerror(errno));
    /* The bind is the same mount object as the source until remounted; make it read-only for
     * the container. A fresh descriptor names the new mount (the old one still names procfs). */
    int bound = openat(proc, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (bound < 0) die("%s: %s", shown, strerror(errno));
    snprintf(b, sizeof b, "/proc/self/fd/%d", bound);
    if (mount(NULL, b, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        die("remount %s read-only: %s", shown, strerror(errno));
    close(bound);
}

static int proc_entries(const char *source, int if_present) {
    if (if_present) {
        struct stat st;
        if (stat(source, &st) != 0 && (errno == ENOENT || errno == ENOTCONN))
            return 0;
    }
    char *state = read_bounded(STDIN_FILENO, STATE_MAX, "the OCI state on standard input");
    whole(state, "the OCI state on standard input");
    char root[PATH_MAX];
    container_root(state, root, sizeof root);
    free(state);

    int src = open(source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (src < 0) die("%s: %s", source, strerror(errno));
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) die("%s: %s", root, strerror(errno));
    char shown[2][PATH_MAX + 16];
    snprintf(shown[0], sizeof shown[0], "%s/proc", root);
    int proc = open_proc_entry(rootfd, "proc", 1, shown[0]);
    static const struct { const char *name; int dir; } entries[] = {{"driver", 1}, {"devices", 0}};
    int from[2], target[2];
    /* Checked all before binding any: a refusal leaves the container's /proc as it was. The
     * descriptors checked are the ones bound: nothing is looked up by name in between. */
    for (int i = 0; i < 2; i++) {
        from[i] = open_source_entry(src, source, entries[i].name, entries[i].dir);
        snprintf(shown[i], sizeof shown[i], "%s/proc/%s", root, entries[i].name);
        target[i] = already_bound(from[i], proc, entries[i].name)
                        ? -1
                        : open_proc_entry(proc, entries[i].name, entries[i].dir, shown[i]);
    }
    for (int i = 0; i < 2; i++)
        if (target[i] >= 0)
            bind_entry(from[i], target[i], proc, source, shown[i], entries[i].name);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "proc") == 0) return proc_entries(argv[2], 0);
    if (argc == 4 && strcmp(argv[1], "proc") == 0 && strcmp(argv[2], "--if-present") == 0)
        return proc_entries(argv[3], 1);
    fprintf(stderr, "usage: mokka-cdi-hook proc [--if-present] SOURCE   (an OCI createContainer hook: the state on stdin)\n");
    return 2;
}
