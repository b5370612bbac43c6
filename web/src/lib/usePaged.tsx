import { useState } from "react";
import { Button, Space, Typography } from "antd";
import { api } from "./api";
import { back, FIRST, forward, pageNumber, pagePath, type Page, type Position } from "./paging";
import { useLoad, type Loaded } from "./useLoad";

export interface Paged<T> extends Loaded<Page<T>> {
  rows: T[];
  at: Position;
  next: () => void;
  previous: () => void;
  first: () => void;
}

/** One page of a server-paged list at `path`; reloaded every `everyMs` when given. */
export function usePaged<T>(path: string, token: string | null, limit = 50, everyMs?: number): Paged<T> {
  const [at, setAt] = useState<Position>(FIRST);
  const [from, setFrom] = useState(path);
  if (from !== path) {
    setFrom(path); // another list (a filter changed): back to its first page
    setAt(FIRST);
  }
  const loaded = useLoad(() => api<Page<T>>(pagePath(path, at.after, limit), { token }), [path, token, at, limit], everyMs);
  const cursor = loaded.data?.next;
  return {
    ...loaded,
    rows: loaded.data?.data ?? [],
    at,
    next: () => cursor && setAt((now) => forward(now, cursor)),
    previous: () => setAt(back),
    first: () => setAt(FIRST),
  };
}

/** Previous / next under a server-paged table. */
export function Pager<T>({ list, testId }: { list: Paged<T>; testId?: string }) {
  return (
    <Space data-testid={testId} style={{ marginTop: 8 }}>
      <Button size="small" disabled={list.at.before.length === 0} onClick={list.previous}>
        Previous
      </Button>
      <Typography.Text type="secondary">page {pageNumber(list.at)}</Typography.Text>
      <Button size="small" disabled={!list.data?.next} onClick={list.next}>
        Next
      </Button>
    </Space>
  );
}
