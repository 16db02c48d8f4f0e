/* slow_fs: a read-only view of a folder through FUSE in which every metadata request (a lookup or getattr, a
   directory listing, an open) waits DELAY_US microseconds before it is answered, as a network file system's
   round trip to its metadata server does (NFS, Lustre, GPFS: 0.1-1 ms). Data reads are not delayed (the kernel's
   read-ahead and posix_fadvise hide a data server's latency the same way on either side of a comparison).
   Names and attributes are cached by the kernel for CACHE_S seconds (default 1), as an NFS client's attribute cache
   holds them; 0 is NFS mounted with `noac`, where every stat asks the server.

   Built and mounted by benchmarks/analyze_slow_fs.py:  slow_fs SOURCE MOUNTPOINT DELAY_US [CACHE_S]  (foreground) */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

static const char *source;
static useconds_t delay_us;
static double cache_s = 1.0;

static int in_source(char *out, const char *path) {
    return snprintf(out, PATH_MAX, "%s%s", source, path) >= PATH_MAX ? -ENAMETOOLONG : 0;
}

static void *slow_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    conn->want |= conn->capable & FUSE_CAP_PARALLEL_DIROPS;
    cfg->entry_timeout = cache_s;
    cfg->attr_timeout = cache_s;
    cfg->negative_timeout = cache_s;
    cfg->use_ino = 1;
    return NULL;
}

static int slow_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    char real[PATH_MAX];
    int err = in_source(real, path);
    if (err) return err;
    usleep(delay_us);
    return lstat(real, st) == -1 ? -errno : 0;
}

static int slow_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset, struct fuse_file_info *fi,
                        enum fuse_readdir_flags flags) {
    (void)offset; (void)fi; (void)flags;
    char real[PATH_MAX];
    int err = in_source(real, path);
    if (err) return err;
    usleep(delay_us);
    DIR *dir = opendir(real);
    if (dir == NULL) return -errno;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_ino = entry->d_ino;
        st.st_mode = (mode_t)DTTOIF(entry->d_type);
        if (fill(buf, entry->d_name, &st, 0, 0)) break;
    }
    closedir(dir);
    return 0;
}

static int slow_open(const char *path, struct fuse_file_info *fi) {
    char real[PATH_MAX];
    int err = in_source(real, path);
    if (err) return err;
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
    usleep(delay_us);
    int fd = open(real, fi->flags);
    if (fd == -1) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int slow_read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi) {
    (void)path;
    ssize_t got = pread((int)fi->fh, buf, size, offset);
    return got == -1 ? -errno : (int)got;
}

static int slow_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static const struct fuse_operations operations = {
    .init = slow_init, .getattr = slow_getattr, .readdir = slow_readdir, .open = slow_open, .read = slow_read,
    .release = slow_release,
};

int main(int argc, char *argv[]) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: slow_fs SOURCE MOUNTPOINT DELAY_US [CACHE_S]\n");
        return 2;
    }
    source = realpath(argv[1], NULL);
    if (source == NULL) {
        perror(argv[1]);
        return 2;
    }
    delay_us = (useconds_t)strtoul(argv[3], NULL, 10);
    if (argc == 5) cache_s = strtod(argv[4], NULL);
    char *fuse_argv[] = {argv[0], argv[2], "-f", "-o", "ro,default_permissions", NULL};
    return fuse_main(5, fuse_argv, &operations, NULL);
}
