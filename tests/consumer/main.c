/* Uses the installed library: one allocation on a simulated device. */
#include <stdio.h>
#include <unimem.h>

int main(void)
{
    um_context *ctx;
    void *p;
    if (um_init("devices=sim:64M", &ctx) != UM_OK || um_malloc(ctx, 1, 4096, NULL, &p) != UM_OK) {
        fprintf(stderr, "consumer: %s\n", um_last_error());
        return 1;
    }
    int dev = um_pointer_device(ctx, p);
    um_free(ctx, p, NULL);
    um_shutdown(ctx);
    printf("consumer: allocated on device %d\n", dev);
    return dev == 1 ? 0 : 1;
}
