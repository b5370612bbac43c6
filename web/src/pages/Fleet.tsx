import { Alert, Badge, Card, Col, Row, Space, Statistic, Table, Tag, Typography } from "antd";
import { api, type List } from "../lib/api";
import { millis } from "../lib/format";
import { useLoad } from "../lib/useLoad";
import { useSession } from "../session";

interface Endpoint {
  url: string;
  state: "ready" | "down";
  reason: string;
  inFlight: number;
}
interface Pool {
  engine: string;
  source: string;
  ready: boolean;
  endpoints: Endpoint[];
}
interface Health {
  status: string;
  upstreams?: Record<string, Pool>;
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

const WINDOW_S = 60;

export default function Fleet() {
  const { token } = useSession();
  const health = useLoad(() => api<Health>("/health", { token }), [token], 3000);
  const log = useLoad(() => api<List<RecordRow>>("/api/v1/requests?limit=200", { token }), [token], 3000);
  const records = log.data?.data ?? [];
  const now = Date.now() / 1000;
  const recent = records.filter((r) => now - r.doneAt <= WINDOW_S);
  const errors = recent.filter((r) => r.status >= 400).length;
  const pools = Object.entries(health.data?.upstreams ?? {});
  const endpoints = pools.flatMap(([name, pool]) => pool.endpoints.map((e) => ({ ...e, pool: name, engine: pool.engine })));

  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Fleet</Typography.Title>
      {(health.error || log.error) && <Alert type="error" showIcon message={health.error ?? log.error} />}
      <Row gutter={16}>
        <Col span={6}>
          <Card>
            <Statistic title="Gateway" value={health.data?.status ?? "…"} data-testid="gateway-status" />
          </Card>
        </Col>
        <Col span={6}>
          <Card>
            <Statistic title="Requests per second (last minute)" value={(recent.length / WINDOW_S).toFixed(2)} />
          </Card>
        </Col>
        <Col span={6}>
          <Card>
            <Statistic title="Errors (last minute)" value={errors} valueStyle={{ color: errors ? "#cf1322" : undefined }} />
          </Card>
        </Col>
        <Col span={6}>
          <Card>
            <Statistic title="In flight" value={endpoints.reduce((n, e) => n + e.inFlight, 0)} />
          </Card>
        </Col>
      </Row>
      <Card title="Pools and endpoints" extra={<Typography.Text type="secondary">refreshes every 3 s</Typography.Text>}>
        <Table
          data-testid="endpoints"
          rowKey={(e) => `${e.pool} ${e.url}`}
          dataSource={endpoints}
          pagination={false}
          size="small"
          columns={[
            { title: "Pool", dataIndex: "pool" },
            { title: "Engine", dataIndex: "engine" },
            { title: "Endpoint", dataIndex: "url" },
            {
              title: "State",
              dataIndex: "state",
              render: (s: string) => <Badge status={s === "ready" ? "success" : "error"} text={s} />,
            },
            { title: "Reason", dataIndex: "reason" },
            { title: "In flight", dataIndex: "inFlight" },
          ]}
        />
      </Card>
      <Card title="Recent requests">
        <Table
          data-testid="requests"
          rowKey="requestId"
          dataSource={[...records].reverse()}
          size="small"
          pagination={{ pageSize: 20 }}
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
      </Card>
    </Space>
  );
}
