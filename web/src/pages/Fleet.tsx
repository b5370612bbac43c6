import { useEffect, useRef, useState } from "react";
import { Alert, Badge, Card, Col, Row, Space, Statistic, Table, Tag, Tooltip, Typography } from "antd";
import { api } from "../lib/api";
import {
  fleetRows,
  inFlight,
  kv,
  perSecond,
  rates,
  sample,
  slots,
  total,
  type Pool,
  type Rates,
  type Row as FleetRow,
  type Sample,
} from "../lib/fleet";
import { millis } from "../lib/format";
import { useLoad } from "../lib/useLoad";
import { Pager, usePaged } from "../lib/usePaged";
import { useSession } from "../session";

interface Health {
  status: string;
  upstreams?: Record<string, Pool>;
}
interface Polled extends Health {
  at: number; // when the answer arrived, seconds: rates are counter differences over time between polls
}
interface Counts {
  promptTokens: number;
  completionTokens: number;
}
interface RecordRow {
  requestId: string;
  model: string;
  servedModel: string;
  endpoint: string | null;
  status: number;
  outcome: string;
  stream: boolean;
  receivedAt: number;
  firstByteAt: number | null;
  doneAt: number;
  tenant: string | null;
  project: string | null;
  engine: Counts | null;
  gateway: Counts;
}

/** Each endpoint's rate between the last two polls of /health (its cumulative counters). */
function useRates(polled: Polled | undefined): Rates {
  const [known, setKnown] = useState<Rates>({});
  const baseline = useRef<Sample | null>(null);
  useEffect(() => {
    if (!polled) return;
    const now = sample(polled.upstreams ?? {}, polled.at);
    setKnown(rates(baseline.current, now));
    baseline.current = now; // after a reset (counters went down) too: the next poll rates from here
  }, [polled]);
  return known;
}

export default function Fleet() {
  const { token } = useSession();
  const health = useLoad(async (): Promise<Polled> => ({ ...(await api<Health>("/health", { token })), at: Date.now() / 1000 }), [token], 3000);
  const table = usePaged<RecordRow>("/api/v1/requests", token, 20, 3000); // the log, newest first, paged by the gateway
  const known = useRates(health.data);
  const rows = fleetRows(health.data?.upstreams ?? {}, known);
  const endpoints = rows.flatMap((r) => r.children ?? []);
  const urls = [...new Set(endpoints.map((e) => e.name))]; // an endpoint in two pools counts once
  const all = total(urls.map((u) => known[u] ?? null));
  const erring = (all?.errorsPerSecond ?? 0) > 0;
  const [collapsed, setCollapsed] = useState<string[]>([]);
  const hidden = health.data !== undefined && health.data.upstreams === undefined;

  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Fleet</Typography.Title>
      {health.error && <Alert type="error" showIcon message={health.error} />}
      <Row gutter={16}>
        <Col span={6}>
          <Card>
            <Statistic title="Gateway" value={health.data?.status ?? "…"} data-testid="gateway-status" />
          </Card>
        </Col>
        <Col span={6}>
          <Card>
            <Statistic title="Requests per second" value={perSecond(all?.perSecond)} data-testid="fleet-rps" />
          </Card>
        </Col>
        <Col span={6}>
          <Card>
            <Statistic title="Errors per second" value={perSecond(all?.errorsPerSecond)} valueStyle={{ color: erring ? "#cf1322" : undefined }} />
          </Card>
        </Col>
        <Col span={6}>
          <Card>
            <Statistic title="In flight" value={endpoints.reduce((n, e) => n + e.inFlight, 0)} />
          </Card>
        </Col>
      </Row>
      <Card title="Pools and endpoints" extra={<Typography.Text type="secondary">refreshes every 3 s</Typography.Text>}>
        {hidden && <Alert type="info" showIcon message="This credential sees the gateway's status only, not its endpoints." />}
        <Table<FleetRow>
          data-testid="endpoints"
          rowKey="key"
          dataSource={rows}
          pagination={false}
          size="small"
          expandable={{
            // every pool open, as rows arrive (defaultExpandAllRows only sees the first, empty render)
            expandedRowKeys: rows.filter((r) => !collapsed.includes(r.key)).map((r) => r.key),
            onExpand: (open, r) => setCollapsed((c) => (open ? c.filter((k) => k !== r.key) : [...c, r.key])),
          }}
          columns={[
            { title: "Pool / endpoint", dataIndex: "name", render: (n: string, r) => <span style={{ whiteSpace: "nowrap", fontWeight: r.children ? 600 : undefined }}>{n}</span> },
            { title: "Engine", dataIndex: "engine" },
            {
              title: "State",
              dataIndex: "state",
              render: (s: string, r) => (
                <Tooltip title={r.reason}>
                  <Badge style={{ whiteSpace: "nowrap" }} status={s === "ready" ? "success" : s === "degraded" ? "warning" : "error"} text={s} />
                </Tooltip>
              ),
            },
            { title: "Reason", dataIndex: "reason" },
            {
              title: <Tooltip title="the gateway's requests on it / the upstream's slots limit">In flight</Tooltip>,
              render: (_, r) => <span data-testid={`inflight-${r.name}`}>{inFlight(r.inFlight, r.slotLimit)}</span>,
            },
            {
              title: <Tooltip title="the engine's own count: busy / total sequence slots (llama-server's /props; vLLM does not publish its limit)">Engine slots</Tooltip>,
              render: (_, r) => <span data-testid={`slots-${r.name}`}>{slots(r.busy, r.total)}</span>,
            },
            { title: "Queue", render: (_, r) => <span data-testid={`queue-${r.name}`}>{r.waiting ?? "unknown"}</span> },
            { title: "KV cache", render: (_, r) => <span data-testid={`kv-${r.name}`}>{kv(r.kvUsage, r.kvCapacityTokens)}</span> },
            {
              title: <Tooltip title="requests finished per second between the last two polls (this gateway worker's counters)">Req/s</Tooltip>,
              render: (_, r) => <span data-testid={`rps-${r.name}`}>{perSecond(r.rate?.perSecond)}</span>,
            },
            {
              title: <Tooltip title="the endpoint's failures per second: transport, timeout, 429/5xx, broken stream (a client's 4xx is not one)">Errors/s</Tooltip>,
              render: (_, r) => (
                <span data-testid={`eps-${r.name}`} style={{ color: r.rate?.errorsPerSecond ? "#cf1322" : undefined }}>
                  {perSecond(r.rate?.errorsPerSecond)}
                </span>
              ),
            },
          ]}
        />
      </Card>
      <Card title="Recent requests">
        <Table
          data-testid="requests"
          rowKey="requestId"
          dataSource={table.rows}
          size="small"
          pagination={false}
          columns={[
            { title: "Time", dataIndex: "receivedAt", render: (t: number) => new Date(t * 1000).toLocaleTimeString() },
            { title: "Tenant", render: (_, r) => (r.tenant ? `${r.tenant}${r.project ? "/" + r.project : ""}` : "–") },
            { title: "Model", dataIndex: "model" },
            { title: "Status", dataIndex: "status", render: (s: number, r) => <Tag color={s < 400 ? "green" : "red"}>{s} {r.outcome}</Tag> },
            {
              title: "Tokens (in / out)",
              render: (_, r) => {
                const c = r.engine ?? r.gateway;
                return `${c.promptTokens} / ${c.completionTokens}`;
              },
            },
            { title: "TTFT", render: (_, r) => millis(r.firstByteAt ? (r.firstByteAt - r.receivedAt) * 1000 : null) },
            { title: "Latency", render: (_, r) => millis((r.doneAt - r.receivedAt) * 1000) },
          ]}
        />
        <Pager list={table} testId="requests-pager" />
      </Card>
    </Space>
  );
}
