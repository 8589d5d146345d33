// The average over the ranks of a data-parallel job of one bucket's gradients (dlnet/allreduce.py's
// DeviceSumReducer). Row r of the table = (gradient offset, offset in a rank's copy of the buckets, unused,
// elements): at most a few thousand elements of one gradient, and work-group r averages row r. g holds this rank's
// own gradients, which the average replaces; others the other ranks' copies, rank-major (the j-th other rank's at
// j * stride). The sum runs in rank order, as the host's does, so every rank computes the same bits.
#ifndef LOCAL
#error "reduce_ranks.cl needs -DLOCAL (work-group size)"
#endif

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void average_ranks(__global float* g, __global const float* others, __global const long* table, int ranks, int rank,
                   long stride, float inverse) {
    __global const long* row = table + 4 * (long)get_group_id(0);
    const long g_off = row[0], o_off = row[1];
    const int n = (int)row[3];
    for (int i = get_local_id(0); i < n; i += LOCAL) {
        float acc = 0.0f;
        for (int r = 0; r < ranks; r++) {
            const float v = r == rank ? g[g_off + i] : others[(long)(r - (r > rank)) * stride + o_off + i];
            acc = r == 0 ? v : acc + v;
        }
        g[g_off + i] = acc * inverse;
    }
}
