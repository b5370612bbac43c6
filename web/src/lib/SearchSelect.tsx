import { useEffect, useRef, useState } from "react";
import { Select, Spin, type SelectProps } from "antd";
import { api } from "./api";
import { searchPath, type Page } from "./paging";

/** Options a picker offers at once: the first rows that match what was typed. */
export const PICK_LIMIT = 20;

type Props = { path: string; token: string | null; reloadOn?: unknown } & Omit<SelectProps, "options" | "showSearch" | "filterOption" | "onSearch" | "loading">;

/** A picker of a server-paged list's ids (tenants, projects): typing searches on the server
 * (`q`, a substring of the id or name), never among the rows of the page on screen; it asks again
 * when `reloadOn` changes (a list reloaded after a create). */
export function SearchSelect({ path, token, reloadOn, ...props }: Props) {
  const [q, setQ] = useState("");
  const [options, setOptions] = useState<{ value: string; label: string }[]>([]);
  const [loading, setLoading] = useState(false);
  const latest = useRef(0);
  useEffect(() => {
    const ask = ++latest.current; // only the newest search's answer is shown
    setLoading(true);
    const timer = setTimeout(() => {
      api<Page<{ id: string }>>(searchPath(path, q, PICK_LIMIT), { token })
        .then((page) => ask === latest.current && setOptions(page.data.map((r) => ({ value: r.id, label: r.id }))))
        .catch(() => ask === latest.current && setOptions([]))
        .finally(() => ask === latest.current && setLoading(false));
    }, q ? 250 : 0);
    return () => clearTimeout(timer);
  }, [path, q, token, reloadOn]);
  return (
    <Select
      {...props}
      showSearch
      filterOption={false}
      onSearch={setQ}
      options={options}
      loading={loading}
      notFoundContent={loading ? <Spin size="small" /> : undefined}
    />
  );
}
