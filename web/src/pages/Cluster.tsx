import { Alert, Badge, Card, Empty, Space, Table, Tag, Typography } from "antd";
import { api } from "../lib/api";
import { useLoad } from "../lib/useLoad";
import { Pager, usePaged } from "../lib/usePaged";
import { useSession } from "../session";

interface Summary {
  clusterId: string;
  observedAt: string;
  reporterVersion: string;
  nodes: number;
  readyNodes: number;
  gpus: number;
  gpusByProduct: Record<string, number>;
  migSlices: Record<string, number>;
  deployments: number;
  deploymentsByPhase: Record<string, number>;
}
interface Gpu {
  vendor: string;
  product: string;
  memoryMib: number;
  count: number;
  computeCapability?: string | null;
  migSlices?: { profile: string; count: number }[];
}
interface Node {
  name: string;
  ready: boolean;
  schedulable: boolean;
  gpus: Gpu[];
}
interface Deployment {
  name: string;
  namespace: string;
  servedModelName: string;
  engine: string;
  phase: string;
  reason: string;
  desiredReplicas: number;
  readyReplicas: number;
  gpusPerReplica: number;
}
interface Detail {
  summary: Summary;
  report: { nodes: Node[]; deployments: Deployment[] };
}

function ClusterDetail({ id }: { id: string }) {
  const { token } = useSession();
  const detail = useLoad(() => api<Detail>(`/api/v1/clusters/${encodeURIComponent(id)}`, { token }), [id]);
  const report = detail.data?.report;
  if (detail.error) return <Alert type="error" message={detail.error} />;
  return (
    <Space direction="vertical" style={{ width: "100%" }}>
      <Table
        size="small"
        rowKey="name"
        loading={detail.loading}
        dataSource={report?.nodes ?? []}
        pagination={false}
        columns={[
          { title: "Node", dataIndex: "name" },
          { title: "Ready", dataIndex: "ready", render: (r: boolean, n) => <Badge status={r ? "success" : "error"} text={r ? (n.schedulable ? "ready" : "cordoned") : "not ready"} /> },
          {
            title: "GPUs",
            render: (_, n) =>
              n.gpus.map((g, i) => (
                <div key={i}>
                  {g.count} × {g.product} · {(g.memoryMib / 1024).toFixed(0)} GiB
                  {g.computeCapability ? ` · cc ${g.computeCapability}` : ""}
                  {g.migSlices?.length ? ` · MIG ${g.migSlices.map((m) => `${m.count}×${m.profile}`).join(", ")}` : ""}
                </div>
              )),
          },
        ]}
      />
      <Table
        size="small"
        rowKey={(d) => `${d.namespace}/${d.name}`}
        dataSource={report?.deployments ?? []}
        pagination={false}
        columns={[
          { title: "Deployment", render: (_, d) => `${d.namespace}/${d.name}` },
          { title: "Model", dataIndex: "servedModelName" },
          { title: "Engine", dataIndex: "engine" },
          { title: "Replicas", render: (_, d) => `${d.readyReplicas} / ${d.desiredReplicas}` },
          { title: "Phase", dataIndex: "phase", render: (p: string) => <Tag color={p === "Ready" ? "green" : "gold"}>{p}</Tag> },
          { title: "Reason", dataIndex: "reason" },
        ]}
      />
    </Space>
  );
}

export default function Cluster() {
  const { token } = useSession();
  // clusters page on the server (10 a page: each card loads its own report); refreshed every 10 s
  const list = usePaged<Summary>("/api/v1/inventory", token, 10, 10000);
  const clusters = list.rows;
  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Cluster</Typography.Title>
      {list.error && <Alert type="error" showIcon message={list.error} />}
      {!list.loading && !list.error && clusters.length === 0 && (
        <Card>
          <Empty description="No cluster has reported yet: the operator (fleet-serving) pushes each cluster's nodes, GPUs and deployments here once it runs." />
        </Card>
      )}
      {clusters.map((c) => (
        <Card
          key={c.clusterId}
          data-testid="cluster"
          title={c.clusterId}
          extra={<Typography.Text type="secondary">reported {new Date(c.observedAt).toLocaleString()} · {c.reporterVersion}</Typography.Text>}
        >
          <Space wrap style={{ marginBottom: 12 }}>
            <Tag>{c.readyNodes} / {c.nodes} nodes ready</Tag>
            <Tag>{c.gpus} GPUs</Tag>
            {Object.entries(c.gpusByProduct).map(([p, n]) => (
              <Tag key={p} color="blue">{n} × {p}</Tag>
            ))}
            {Object.entries(c.deploymentsByPhase).map(([p, n]) => (
              <Tag key={p} color="purple">{n} {p}</Tag>
            ))}
          </Space>
          <ClusterDetail id={c.clusterId} />
        </Card>
      ))}
      {(list.data?.next || list.at.before.length > 0) && <Pager list={list} testId="clusters-pager" />}
    </Space>
  );
}
