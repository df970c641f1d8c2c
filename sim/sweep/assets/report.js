// report.html's script: sortable tables, the throughput-vs-memory scatter drawn as pareto.png draws it
// (colours, front, star, legend: D.style, sim/sweep/report.py PARETO_STYLE; sim/sweep/report_html.py)
const D = JSON.parse(document.getElementById('data').textContent);
function sortable(t){const hs=t.querySelectorAll('th');hs.forEach((h,i)=>h.addEventListener('click',()=>{
 const rows=[...t.tBodies[0].rows];const asc=h.dataset.asc!=='1';hs.forEach(x=>delete x.dataset.asc);
 h.dataset.asc=asc?'1':'0';const key=r=>{const c=r.cells[i];const v=c.dataset.v;return v!==undefined?+v:c.textContent};
 rows.sort((a,b)=>{const x=key(a),y=key(b);return (x<y?-1:x>y?1:0)*(asc?1:-1)});rows.forEach(r=>t.tBodies[0].appendChild(r));}));}
document.querySelectorAll('table.sort').forEach(sortable);
function ticks(lo,hi,n){const raw=(hi-lo)/n||1;const mag=Math.pow(10,Math.floor(Math.log10(raw)));
 const step=[1,2,5,10].map(m=>m*mag).find(s=>s>=raw);const out=[];for(let v=Math.ceil(lo/step)*step;v<=hi+1e-9*step;v+=step)out.push(v);return out;}
function star(cx,cy,r){const p=[];for(let i=0;i<10;i++){const a=Math.PI/2+i*Math.PI/5,q=i%2?r*0.45:r;
 p.push((cx+q*Math.cos(a)).toFixed(1)+','+(cy-q*Math.sin(a)).toFixed(1));}return p.join(' ');}
function scatter(){
 const svg=document.getElementById('pareto');if(!svg)return;const pts=D.points;if(!pts.length)return;
 const W=1120,H=440,L=70,B=48,T=20,R=250,S=D.style;  // R: the legend, right of the axes
 const xs=pts.map(p=>p.mem),ys=pts.map(p=>p.tok/1e3);
 const x0=0,x1=Math.max(...xs,D.capacity||0)*1.05,ylo=Math.min(...ys),yhi=Math.max(...ys);
 const y0=Math.max(0,ylo-(yhi-ylo)*0.05-1e-9),y1=yhi+(yhi-ylo)*0.05+1e-9;
 const sx=v=>L+(v-x0)/(x1-x0||1)*(W-L-R),sy=v=>H-B-(v-y0)/(y1-y0||1)*(H-B-T);
 const ns='http://www.w3.org/2000/svg';const el=(n,a,parent)=>{const e=document.createElementNS(ns,n);for(const k in a)e.setAttribute(k,a[k]);(parent||svg).appendChild(e);return e};
 el('line',{x1:L,y1:H-B,x2:W-R,y2:H-B,stroke:'#444'});el('line',{x1:L,y1:T,x2:L,y2:H-B,stroke:'#444'});
 ticks(x0,x1,8).forEach(v=>{el('line',{x1:sx(v),x2:sx(v),y1:H-B,y2:H-B+4,stroke:'#444'});
  el('text',{x:sx(v),y:H-B+17,'text-anchor':'middle','font-size':11}).textContent=v.toLocaleString();});
 ticks(y0,y1,6).forEach(v=>{el('line',{x1:L-4,x2:L,y1:sy(v),y2:sy(v),stroke:'#444'});
  el('text',{x:L-7,y:sy(v)+4,'text-anchor':'end','font-size':11}).textContent=v.toLocaleString();});
 el('text',{x:(W+L)/2,y:H-8,'text-anchor':'middle','font-size':12}).textContent=S.x_label;
 el('text',{x:16,y:(H-B+T)/2,'text-anchor':'middle','font-size':12,transform:`rotate(-90 16 ${(H-B+T)/2})`}).textContent=S.y_label;
 const tip=document.getElementById('tip');const counts={};
 pts.forEach(p=>{const look=S.sources[p.src]||{color:'#888',size:6};counts[p.src]=(counts[p.src]||0)+1;
  const c=el('circle',{cx:sx(p.mem),cy:sy(p.tok/1e3),r:Math.max(2,Math.sqrt(look.size)*0.75),fill:look.color,
  'fill-opacity':0.8,class:'pt'+(p.front?' front':'')});c.dataset.id=p.id;
  c.addEventListener('mousemove',e=>{tip.style.display='block';tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';
   tip.innerHTML=`<b>#${p.rank}</b> ${p.plan}<br>${p.t.toFixed(3)} s/iteration, ${Math.round(p.tok).toLocaleString()} tokens/s, ${p.mem.toFixed(1)} GiB`+(p.front?'<br>on the Pareto front':'');});
  c.addEventListener('mouseleave',()=>{tip.style.display='none'});
  c.addEventListener('click',()=>{const d=document.getElementById('plan-'+p.id);
   if(d){d.scrollIntoView({behavior:'smooth'});d.style.outline='3px solid #d62728';setTimeout(()=>d.style.outline='',1500);}
   else{alert(`#${p.rank} ${p.plan}: no timeline (only the ${D.written} written plans have one; see simpar sweep --plans)`);}});});
 const byId={};pts.forEach(p=>byId[p.id]=p);const fr=D.front.map(i=>byId[i]).filter(Boolean);
 if(fr.length){let d=`M${sx(fr[0].mem)},${sy(fr[0].tok/1e3)}`;  // a step after each point, as matplotlib's where="post"
  for(let i=1;i<fr.length;i++)d+=`H${sx(fr[i].mem)}V${sy(fr[i].tok/1e3)}`;
  el('path',{d:d,fill:'none',stroke:S.front.color,'stroke-width':1.2,class:'front-line','pointer-events':'none'});}
 const best=pts.find(p=>p.rank===1);
 if(best)el('polygon',{points:star(sx(best.mem),sy(best.tok/1e3),9),fill:S.best.color,class:'best','pointer-events':'none'});
 if(D.capacity){el('line',{x1:sx(D.capacity),y1:T,x2:sx(D.capacity),y2:H-B,stroke:S.capacity.color,'stroke-dasharray':'5 3',class:'capacity'});}
 // the legend, as pareto.png's (lower right)
 const items=[];for(const k in S.sources)if(counts[k])items.push(['dot',S.sources[k].color,`${S.sources[k].label} (${counts[k].toLocaleString()})`]);
 if(fr.length)items.push(['line',S.front.color,S.front.label]);if(best)items.push(['star',S.best.color,S.best.label]);
 if(D.capacity)items.push(['dash',S.capacity.color,S.capacity.label]);
 const lw=230,lh=18*items.length+10,lx=W-R+12,ly=T;const g=el('g',{class:'legend'});
 el('rect',{x:lx,y:ly,width:lw,height:lh,fill:'#fff','fill-opacity':0.9,stroke:'#bbb'},g);
 items.forEach(([kind,color,label],i)=>{const y=ly+14+18*i,x=lx+16;
  if(kind==='dot')el('circle',{cx:x,cy:y-4,r:4,fill:color},g);
  else if(kind==='star')el('polygon',{points:star(x,y-4,7),fill:color},g);
  else el('line',{x1:x-9,x2:x+9,y1:y-4,y2:y-4,stroke:color,'stroke-width':1.5,'stroke-dasharray':kind==='dash'?'5 3':''},g);
  el('text',{x:x+16,y:y,'font-size':11},g).textContent=label;});
}
scatter();
document.body.dataset.rendered='yes';
