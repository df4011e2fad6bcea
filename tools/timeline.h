/* `unimem timeline`: what cmd_timeline.c (the command) takes from
 * timeline_page.c (the page it writes). */
#ifndef UM_TIMELINE_H
#define UM_TIMELINE_H

/* The page's text around its data, one line per string, NULL-terminated:
 * the command writes the doctype and <title>, tl_page_head, the data
 * (JSON in a <script type="application/json"> element), then tl_page_tail. */
extern const char *const tl_page_head[];
extern const char *const tl_page_tail[];

#endif
