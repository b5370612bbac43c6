// Lists page on the server: a page is `limit` rows after a cursor, and a response
// carries `next` while more rows follow (fleet_core/shared/paging.py). The console keeps the cursors
// of the pages it has passed, so "previous" goes back without offsets.

export interface Page<T> {
  object: "list";
  data: T[];
  next?: string;
}

/** `path` asking for `limit` rows after `after` (the first page without it). */
export function pagePath(path: string, after: string | undefined, limit: number): string {
  const [base, query = ""] = path.split("?", 2);
  const params = new URLSearchParams(query);
  params.set("limit", String(limit));
  if (after) params.set("after", after);
  else params.delete("after");
  return `${base}?${params.toString()}`;
}

/** Where a client is in a list: the cursors of the pages before the current one, and its own. */
export interface Position {
  before: (string | undefined)[];
  after: string | undefined;
}

export const FIRST: Position = { before: [], after: undefined };

/** One page on, to the page that starts after `next`. */
export function forward(at: Position, next: string): Position {
  return { before: [...at.before, at.after], after: next };
}

/** One page back (the first page stays the first). */
export function back(at: Position): Position {
  if (at.before.length === 0) return FIRST;
  return { before: at.before.slice(0, -1), after: at.before[at.before.length - 1] };
}

/** The 1-based number of the page at `at`. */
export function pageNumber(at: Position): number {
  return at.before.length + 1;
}

/** The longest search a list accepts (`q`, fleet_core/shared/paging.py's MAX_SEARCH). */
export const MAX_SEARCH = 64;

/** `path`'s first `limit` rows whose id or name holds `q` (trimmed, cut to MAX_SEARCH; every row when empty). */
export function searchPath(path: string, q: string, limit: number): string {
  const [base, query = ""] = path.split("?", 2);
  const params = new URLSearchParams(query);
  params.set("limit", String(limit));
  params.delete("after");
  const text = q.trim().slice(0, MAX_SEARCH);
  if (text) params.set("q", text);
  else params.delete("q");
  return `${base}?${params.toString()}`;
}
